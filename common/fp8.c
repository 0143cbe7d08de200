/* fp8.c: the random-sign Hadamard transform, outlier inputs and the FP8 stage's arithmetic emulated on
 * the host (fp8.h). */
#include "fp8.h"
#include "half.h"
#include "harness.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void hadamard_signs(int8_t *signs, int d, uint64_t seed)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    for (int k = 0; k < d; k++) { /* one splitmix64 step a sign */
        z += 0x9e3779b97f4a7c15ull;
        uint64_t r = z;
        r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
        r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
        r ^= r >> 31;
        signs[k] = (r >> 63) ? -1 : 1;
    }
}

void hadamard_rows(float *x, size_t rows, int d, const int8_t *signs)
{
    const float norm = 1.0f / sqrtf((float)d);
    for (size_t r = 0; r < rows; r++) {
        float *v = x + r * d;
        for (int k = 0; k < d; k++) v[k] *= signs[k];
        /* H_{2h} = [[H_h, H_h], [H_h, -H_h]]: butterflies of stride h = 1, 2, 4, ... */
        for (int h = 1; h < d; h *= 2)
            for (int i = 0; i < d; i += 2 * h)
                for (int k = i; k < i + h; k++) {
                    const float a = v[k], b = v[k + h];
                    v[k] = a + b, v[k + h] = a - b;
                }
        for (int k = 0; k < d; k++) v[k] *= norm;
    }
}

int outlier_channel(int k, int d)
{
    return (k * d) / OUTLIER_CHANNELS + d / (2 * OUTLIER_CHANNELS) + k; /* 4 channels, apart, not aligned */
}

void add_outliers(const struct shape *sh, float factor, enum dtype dt, float *Q, float *K)
{
    const int d = sh->d;
    const size_t rows[2] = {shape_rows(sh), shape_kv_elems(sh) / d}; /* K: [B, H_kv, N_kv, d] */
    float *x[2] = {Q, K};
    for (int t = 0; t < 2; t++)
        for (size_t r = 0; r < rows[t]; r++)
            for (int k = 0; k < OUTLIER_CHANNELS && k < d; k++) {
                float *v = &x[t][r * d + outlier_channel(k, d) % d];
                *v = round_to_dtype(round_to_dtype(*v * factor, DT_F16), dt);
            }
}

/* ---- the FP8 stage's arithmetic, emulated (fp8.h) ---- */

void fp8_quantize(float *x, size_t rows, int d, size_t block, float *scales)
{
    for (size_t r0 = 0; r0 < rows; r0 += block) {
        const size_t r1 = r0 + block < rows ? r0 + block : rows;
        float amax = 0.0f;
        for (size_t e = r0 * d; e < r1 * d; e++) amax = fmaxf(amax, fabsf(x[e]));
        const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f; /* the block's max|x| becomes 448 */
        /* times 1 / s, as the quantization kernel does: x / s, one rounding fewer, puts a value
         * lying within an fp32 ulp of a tie between two e4m3 values on the other side of it now
         * and then, and with outlier channels one such value moves a score by units */
        const float inv = 1.0f / s;
        for (size_t e = r0 * d; e < r1 * d; e++) x[e] = e4m3_to_f32(f32_to_e4m3(x[e] * inv));
        scales[r0 / block] = s;
    }
}

void fp8_head_quantize(struct fp8_head *hd, const struct shape *sh, const float *Q, const float *K, const float *V,
                       int b, int h, int block, int hadamard)
{
    const int d = sh->d, N = sh->N, N_kv = shape_kv_len(sh), hk = kv_head_of(sh, h);
    const size_t nq = (size_t)N * d, nkv = (size_t)N_kv * d;
    hd->d = d, hd->block = block, hd->p_dtype = DT_FP8;
    hd->q = malloc((nq + 2 * nkv) * sizeof(float)), hd->k = hd->q + nq, hd->v = hd->k + nkv;
    hd->sq = malloc(((size_t)CEIL_DIV(N, block) + 2 * (size_t)CEIL_DIV(N_kv, block)) * sizeof(float));
    hd->sk = hd->sq + CEIL_DIV(N, block), hd->sv = hd->sk + CEIL_DIV(N_kv, block);
    int8_t *signs = hadamard ? malloc((size_t)d) : NULL;
    if (!hd->q || !hd->sq || (hadamard && !signs)) {
        fprintf(stderr, "out of host memory (the FP8 emulation of one head)\n");
        exit(EXIT_USAGE);
    }
    memcpy(hd->q, Q + idx4(sh, b, h, 0, 0), nq * sizeof(float));
    memcpy(hd->k, K + idx4_kv(sh, b, hk, 0, 0), nkv * sizeof(float));
    memcpy(hd->v, V + idx4_kv(sh, b, hk, 0, 0), nkv * sizeof(float));
    if (hadamard) { /* V is not transformed */
        hadamard_signs(signs, d, FP8_HADAMARD_SEED);
        hadamard_rows(hd->q, N, d, signs), hadamard_rows(hd->k, N_kv, d, signs);
        free(signs);
    }
    fp8_quantize(hd->q, N, d, block, hd->sq);
    fp8_quantize(hd->k, N_kv, d, block, hd->sk);
    fp8_quantize(hd->v, N_kv, d, block, hd->sv);
    hd->sv_max = 0.0f;
    for (int j = 0; j < CEIL_DIV(N_kv, block); j++) hd->sv_max = fmaxf(hd->sv_max, hd->sv[j]);
}

void fp8_head_free(struct fp8_head *hd)
{
    free(hd->q), free(hd->sq);
    hd->q = hd->k = hd->v = hd->sq = hd->sk = hd->sv = NULL;
}

/* q . k as Hopper's tensor cores add e4m3 products: not in full fp32. At each k32 step (one
 * m64nNk32 wgmma) the 32 products and the running sum are aligned to the largest exponent among
 * them and cut (toward zero) to TC_BITS bits below it, then added: about 13 bits are kept, as the
 * FP8 GEMM literature measures them (DeepSeek-V3's report, section 3.5.2). An emulation with
 * exact fp32 sums would be more accurate than the hardware, and a check built on it would fail a
 * correct kernel on rows whose scores are large (outlier channels). The steps run over `steps` x 32
 * channels, those past d zeros (stage 19 pads d = 64 rows to 128 bytes: two steps more, in which
 * the sum is cut again). */
#define TC_BITS 13
static float tc_dot(const float *q, const float *k, int d, int steps)
{
    double acc = 0.0;
    for (int s = 0; s < steps; s++) {
        double t[33], mx = fabs(acc);
        int n = 0;
        t[n++] = acc;
        for (int c = 32 * s; c < 32 * s + 32; c++) {
            t[n] = c < d ? (double)q[c] * k[c] : 0.0;
            mx = fmax(mx, fabs(t[n]));
            n++;
        }
        if (mx == 0.0) continue;
        int e;
        frexp(mx, &e); /* mx in [2^(e-1), 2^e) */
        const double ulp = ldexp(1.0, e - 1 - TC_BITS);
        double sum = 0.0;
        for (int u = 0; u < n; u++) sum += trunc(t[u] / ulp) * ulp;
        acc = (float)sum;
    }
    return (float)acc;
}

void fp8_forward_row(const struct fp8_head *hd, int i, int keys, float scale, float *S, double *o, double *lse,
                     double *allowance)
{
    const int d = hd->d, block = hd->block, steps = (d < 128 ? 128 : d) / 32;
    const float *q = hd->q + (size_t)i * d;
    /* S_ij = sQ sK (Q8_i . K8_j), summed as the tensor cores sum e4m3 products (tc_dot; fp16 mode:
     * fp32 sums); m_i = max_j S_ij */
    float m = -INFINITY;
    double mag = 0; /* the largest sK_j sum_c |q_c k_jc| of the row (the allowance, below) */
    for (int j = 0; j < keys; j++) {
        const float *k = hd->k + (size_t)j * d;
        float dot = 0.0f;
        if (hd->p_dtype == DT_FP8) dot = tc_dot(q, k, d, steps);
        else
            for (int c = 0; c < d; c++) dot += q[c] * k[c];
        S[j] = dot * hd->sq[i / block] * hd->sk[j / block];
        m = fmaxf(m, S[j]);
        if (allowance && hd->p_dtype == DT_FP8) {
            double a = 0;
            for (int c = 0; c < d; c++) a += fabs((double)q[c] * k[c]);
            mag = fmax(mag, a * hd->sk[j / block]);
        }
    }
    /* How far Hopper's scores, times scale, may be from tc_dot's: the model and the hardware both
     * keep about TC_BITS bits at each k32 step, but not the same bits (where the hardware aligns,
     * in what groups it adds), so at each step they may part by a couple of units in the last kept
     * place of the products' magnitudes: steps 2^(1 - TC_BITS) of the sum of |q_c k_jc|, the
     * largest over the row's keys. 0 where P is not FP8 (fp32 sums). */
    if (allowance) *allowance = (double)scale * hd->sq[i / block] * mag * steps * ldexp(1.0, 1 - TC_BITS);
    /* P_ij = exp(scale (S_ij - m_i)), l_i = sum_j P_ij in fp32; O_i = sum_j w_ij V8_j / l_i. FP8: P
     * is rounded as the stage rounds it, e4m3(P f_j) with f_j = 256 sV_j / SV (SV the head's largest
     * V scale), and w = e4m3(P f_j) SV / 256: a V block of a scale far below SV puts its P near
     * e4m3's subnormals (below 2^-6) or under its smallest value (2^-9), on the GPU and here alike.
     * fp16: w = fp16(P) sV_j (scales of 1). */
    float l = 0.0f;
    for (int c = 0; c < d; c++) o[c] = 0.0;
    for (int j = 0; j < keys; j++) {
        const float P = expf(scale * (S[j] - m));
        l += P;
        const float w = hd->p_dtype == DT_FP8
                            ? e4m3_to_f32(f32_to_e4m3(P * (256.0f / hd->sv_max * hd->sv[j / block]))) * (hd->sv_max / 256.0f)
                            : round_to_dtype(P, DT_F16) * hd->sv[j / block];
        const float *v = hd->v + (size_t)j * d;
        for (int c = 0; c < d; c++) o[c] += (double)(w * v[c]);
    }
    for (int c = 0; c < d; c++) o[c] /= l;
    if (lse) *lse = (double)scale * m + log((double)l);
}
