/* launch.cuh: what every GPU stage's launcher does before its first launch.
 *
 * A kernel may use more than 48 KiB of dynamic shared memory per block only after it opts in, and
 * only up to the device's limit: 227 KiB on sm_90 and sm_100, 163 KiB on sm_80, 99 KiB on the
 * consumer cards (sm_86, sm_89, sm_120), 64 KiB on Turing (sm_75, the T4). ATTN_SMEM_CAP_KB
 * lowers the limit, so that one GPU can run what a smaller one would (gpu_smem_limit).
 *
 * So a stage lists, for each head dim, the tile configurations its kernel may take, fastest
 * first, and launches the first whose shared memory fits (first_fit). smem_optin then checks the
 * size once more, so a tile too large fails with a message that says so rather than with a
 * launch error, and opts the kernel in. */
#ifndef LAUNCH_CUH
#define LAUNCH_CUH
#include "common/attn.h"
#include "common/cuda/cuda_check.h"
#include <algorithm>
#include <stdarg.h>
#include <stdio.h>

/* The shared memory a block may have, in bytes: the device's opt-in limit, or ATTN_SMEM_CAP_KB's
 * cap where that is less (common/cuda/runner.cu; worked out once, cheap to call); and the cap
 * alone, 0 when unset (common/cli.c). */
extern "C" size_t gpu_smem_limit(void);
extern "C" int smem_cap_bytes(size_t *cap, char *why, size_t n);

/* Where the limit is ATTN_SMEM_CAP_KB's, its name for a message; else "". */
static inline const char *smem_cap_words(size_t limit)
{
    char unused[160];
    size_t cap;
    return !smem_cap_bytes(&cap, unused, sizeof unused) && cap == limit ? " (ATTN_SMEM_CAP_KB)" : "";
}

/* Returns 0, or ATTN_UNSUPPORTED with the reason in why (d only names the configuration in the
 * message). The opt-in is a runtime call, so it is made once per kernel and size, not on every
 * launch: the launchers call this inside the timed loop. */
template <typename Kernel>
static int smem_optin(Kernel *kernel, size_t bytes, int d, char *why, size_t n)
{
    /* kernels already opted in, with the size they asked for (a stage has a few dozen), on which
     * device: the attribute is the device's own, and a multi-rank stage (stage 20) launches the
     * same kernel on several */
    static struct { const void *kernel; size_t bytes; int dev; } done[128];
    static int n_done = 0;
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    for (int k = 0; k < n_done; k++)
        if (done[k].kernel == (const void *)kernel && done[k].bytes >= bytes && done[k].dev == dev) return 0;
    const size_t limit = gpu_smem_limit();
    if (bytes > limit) {
        snprintf(why, n, "d=%d needs %zu.%zu KiB of shared memory per block; this device allows %zu KiB%s", d,
                 bytes / 1024, bytes % 1024 * 10 / 1024, limit / 1024, smem_cap_words(limit));
        return ATTN_UNSUPPORTED;
    }
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (n_done < 128) done[n_done++] = {(const void *)kernel, bytes, dev};
    return 0;
}

/* How many blocks of `kernel` (`threads` a block, `bytes` of dynamic shared memory, opted in here)
 * the whole device runs at once: its SMs times the blocks one SM holds (the occupancy API; at least
 * one). The split rules of stages 10 and 15 size one wave of blocks by it. -1 with the reason in
 * why when the device cannot be asked. */
template <typename Kernel>
static int resident_blocks_of(Kernel *kernel, int threads, size_t bytes, int d, char *why, size_t n)
{
    if (smem_optin(kernel, bytes, d, why, n)) return -1;
    int dev = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, bytes) != cudaSuccess) {
        snprintf(why, n, "cannot ask the device for its SMs and the kernel's occupancy: %s",
                 cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    return sms * (per_sm > 1 ? per_sm : 1);
}

/* ---- a stage's tile configurations, fastest first ----
 *
 * Each configuration is a type holding its tile sizes as constants and `static constexpr size_t
 * smem_bytes`; config_list<A, B, C> lists a head dim's, fastest first (the first is the one an
 * H100 or H200 runs). first_fit calls f(Config{}) with the first whose smem_bytes fits `limit`,
 * so the same code launches a kernel (f instantiates it for that configuration), names the tiles
 * for the summary and computes the HBM formula: all three always agree on the tiles. */
template <class... Configs>
struct config_list {};

/* None fits: what the smallest needs. */
template <class F>
static int first_fit(config_list<>, size_t limit, int d, char *why, size_t n, F &&, size_t smallest = 0)
{
    snprintf(why, n, "d=%d needs at least %zu.%zu KiB of shared memory per block (its smallest tiles); this device "
             "allows %zu KiB%s", d, smallest / 1024, smallest % 1024 * 10 / 1024, limit / 1024, smem_cap_words(limit));
    return ATTN_UNSUPPORTED;
}

template <class First, class... Rest, class F>
static int first_fit(config_list<First, Rest...>, size_t limit, int d, char *why, size_t n, F &&f,
                     size_t smallest = (size_t)-1)
{
    if (First::smem_bytes <= limit) return f(First{});
    return first_fit(config_list<Rest...>{}, limit, d, why, n, f,
                     First::smem_bytes < smallest ? First::smem_bytes : smallest);
}

/* A stage's `tiles` function fills its answer with this: the tile sizes and the words for the
 * summary (printf-style). Returns 0. */
static inline int tiles_found(struct tile_config *c, int Br, int Bc, size_t smem_bytes, const char *fmt, ...)
{
    c->Br = Br, c->Bc = Bc, c->smem_bytes = smem_bytes;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->text, sizeof c->text, fmt, ap);
    va_end(ap);
    return 0;
}

/* For a stage's hbm_traffic: the rows of K (and of V) that one head's Q tiles read, each Q tile of
 * Tiles::Br rows reading the K/V tiles of Tiles::Bc keys it sees (all of them, or under the causal
 * mask those up to its last row), none past N. */
template <class Tiles>
double kv_rows_read(const struct shape *sh)
{
    const int N = sh->N, Tr = CEIL_DIV(N, Tiles::Br), Tc = CEIL_DIV(N, Tiles::Bc);
    double rows = 0;
    for (int i = 0; i < Tr; i++) {
        const int n_tiles = sh->causal ? std::min(Tc, (std::min((i + 1) * Tiles::Br, N) - 1) / Tiles::Bc + 1) : Tc;
        rows += std::min(n_tiles * Tiles::Bc, N);
    }
    return rows;
}

#endif
