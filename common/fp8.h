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
#ifdef __cplusplus
}
#endif
#endif
