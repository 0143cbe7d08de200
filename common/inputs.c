/* inputs.c: seeded inputs. A fixed generator (splitmix64) so that a seed gives the same numbers
 * on every machine, and every value rounded to the stage's dtype (and always to fp16), so that
 * the CPU stages in fp32 and the GPU stages in fp16 see exactly the same inputs. */
#include "harness.h"
#include "half.h"

/* The k-th number (from 0) of the splitmix64 stream seeded with `seed`: its state only adds a
 * constant per number, so the k-th is at seed + (k + 1) times it, and the numbers can be made in
 * any order, on any number of threads, always the same. */
static uint64_t splitmix64_at(uint64_t seed, uint64_t k)
{
    uint64_t z = seed + (k + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void fill_uniform(float *x, size_t n, uint64_t seed, float amplitude, enum dtype dt)
{
    /* (OpenMP where built with it: at the benchmark's shapes the inputs are 10^8 numbers a run) */
#pragma omp parallel for schedule(static)
    for (size_t k = 0; k < n; k++) {
        /* top 24 bits -> uniform in [-1, 1) */
        float u = (float)(splitmix64_at(seed, k) >> 40) * (2.0f / 16777216.0f) - 1.0f;
        float v = round_to_dtype(u * amplitude, DT_F16);
        x[k] = round_to_dtype(v, dt);
    }
}

void make_inputs(const struct shape *sh, uint64_t seed, float amplitude, enum dtype dt,
                 float *Q, float *K, float *V)
{
    size_t n = shape_elems(sh), nkv = shape_kv_elems(sh);
    /* three independent streams: Q, K and V do not share numbers (K and V [B, H_kv, N_kv, d]) */
    fill_uniform(Q, n, seed * 3 + 0, amplitude, dt);
    fill_uniform(K, nkv, seed * 3 + 1, amplitude, dt);
    fill_uniform(V, nkv, seed * 3 + 2, amplitude, dt);
}

void fill_rounded(float *x, size_t n, enum dtype dt)
{
    for (size_t k = 0; k < n; k++) x[k] = round_to_dtype(x[k], dt);
}
