/* fp8.h: what the FP8 stage needs on the host beside the e4m3 conversions (half.h): the
 * random-sign Hadamard transform of incoherent processing, and inputs with outlier features.
 *
 * Incoherent processing (FlashAttention-3, section 3.3): Q and K are multiplied by the same
 * orthogonal matrix M = H diag(s) / sqrt(d) before they are quantized, H the d x d Hadamard
 * matrix (entries +-1, H H^T = d I) and s random signs. Q K^T = (Q M^T)(K M^T)^T, so the scores
 * are unchanged, but a channel that is large in every row (an outlier feature) is spread over all
 * d channels, and a scale per block of rows no longer has to cover it alone. */
#ifndef FP8_H
#define FP8_H
#include "attn.h"
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* ---- what the FP8 stage and the harness agree on ---- */
/* Q, K and V are quantized with one fp32 scale, max|x| / E4M3_MAX (1 for an all-zero block), per
 * block of this many rows of a head (the last block of a head partial): a scale per K/V tile of a
 * 64-key kernel, and one per 64 query rows. */
#define FP8_BLOCK_ROWS 64
/* The Hadamard transform's signs, the same in the stage (on the host) and in the check:
 * hadamard_signs(signs, d, FP8_HADAMARD_SEED). */
#define FP8_HADAMARD_SEED 1

/* d random signs (+1 or -1) from seed, the same on every machine. */
void hadamard_signs(int8_t *signs, int d, uint64_t seed);
/* Each of `rows` rows of x ([rows][d], d a power of 2) replaced by H diag(signs) x / sqrt(d), by the
 * fast Walsh-Hadamard transform (d log2 d additions), in place. */
void hadamard_rows(float *x, size_t rows, int d, const int8_t *signs);
/* The outlier channels of --outliers: OUTLIER_CHANNELS of the d, spread over the head dim. */
#define OUTLIER_CHANNELS 4
int outlier_channel(int k, int d);
/* Q and K ([B, H, N, d]) with their outlier channels multiplied by `factor` in every row (then
 * rounded to dt again): the features some channels of real models carry in every token. */
void add_outliers(const struct shape *sh, float factor, enum dtype dt, float *Q, float *K);

/* ---- the FP8 stage's arithmetic, emulated on the host ----
 * What the check of an FP8 run (common/check.c) and bench/fp8_error.c compute, row by row:
 *   Q, K, V of a head quantized to e4m3 with one fp32 scale per block of rows (fp8_quantize), Q
 *   and K multiplied by the random-sign Hadamard matrix first where the run says so;
 *   S_ij = sQ sK (Q8_i . K8_j), an fp32 sum; m_i = max_j S_ij; P_ij = exp(scale (S_ij - m_i)) in
 *   fp32, l_i = sum_j P_ij in fp32; L_i = scale m_i + log l_i;
 *   P carried into P V as e4m3(P_ij f_j), f_j = 256 sV_j / SV with SV the head's largest V scale,
 *   as stage 19 folds V's scale into P: P <= 1, and P f_j <= 256 < 448 keeps the small values of
 *   the blocks whose scale is SV out of e4m3's subnormals (a free factor for a kernel: exp2(x +
 *   log2 f_j)); a block of a far smaller scale pushes its P toward them, in the stage as here;
 *   O_i = sum_j e4m3(P_ij f_j) V8_j SV / (256 l_i), each product in fp32, summed in fp64.
 * The sums of P V are fp64, where a kernel's are fp32: the difference, about sqrt(N) 2^-24 of O,
 * is far below e4m3's rounding (2^-4) and inside the check's floor. The row max is the whole
 * row's, where a kernel's P_ij is relative to the running max of the keys it has seen: the same
 * rounding of other values, errors of the same size but not the same errors (the check's factor
 * 2 is for that). */

/* x [rows][d] quantized in place to e4m3 values, kept as floats in units of their scale (x times
 * 1 / s, rounded to e4m3), with one scale s = max|x| / E4M3_MAX per `block` rows (block >= rows:
 * one for all; 1 for an all-zero block); scales[r / block] gets the scale of row r. */
void fp8_quantize(float *x, size_t rows, int d, size_t block, float *scales);

/* One head of Q, K, V as the FP8 stage holds it: q [N][d], k and v [N_kv][d] in units of their
 * block's scale, and the scales sq, sk, sv, one per `block` rows. */
struct fp8_head {
    int d, block;
    enum dtype p_dtype;      /* P carried into P V: DT_FP8 as e4m3(P f_j); DT_F16 rounded to fp16 (the
                              * fp16 stages' way, with q, k, v unquantized and scales of 1) */
    float *q, *k, *v;
    float *sq, *sk, *sv;
    float sv_max;            /* the largest of the head's sv: P is carried against it (fp8_forward_row) */
};
/* Head (b, h) of Q and its KV head's K and V (kv_head_of), copied into fresh memory, Q and K
 * through hadamard_rows with the stage's signs (FP8_HADAMARD_SEED) where `hadamard`, then
 * quantized in blocks of `block` rows (the stage's: FP8_BLOCK_ROWS). d a power of 2 where
 * `hadamard`. fp8_head_free releases it. */
void fp8_head_quantize(struct fp8_head *hd, const struct shape *sh, const float *Q, const float *K, const float *V,
                       int b, int h, int block, int hadamard);
void fp8_head_free(struct fp8_head *hd);
/* Row i of the head's forward the FP8 way (above), over keys 0 .. keys - 1 (keys_seen): o[d] and,
 * where lse is not NULL, *lse; where allowance is not NULL, *allowance: the most the row's scores,
 * times scale, may differ between Hopper's FP8 tensor cores and the emulation's model of them
 * (tc_dot), 0 where P is not FP8. S is scratch of `keys` floats. */
void fp8_forward_row(const struct fp8_head *hd, int i, int keys, float scale, float *S, double *o, double *lse,
                     double *allowance);
#ifdef __cplusplus
}
#endif
#endif
