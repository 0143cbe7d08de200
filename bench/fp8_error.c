/* fp8_error.c: what FP8 does to attention's accuracy, before a kernel exists: the FP8 stage's
 * arithmetic emulated on the CPU, its error against the fp64 oracle, per way of quantizing.
 *
 * For each (batch, head), causal or not, the forward is computed as the FP8 stage computes it, by
 * the emulation the check of an FP8 run uses (fp8_forward_row, common/fp8.h: Q, K, V quantized to
 * e4m3 with fp32 scales; S = sQ sK (Q8 K8^T) and l in fp32; P carried into P V as e4m3(256 P sV /
 * SV), SV the head's largest V scale).
 * The ways of quantizing Q, K and V (one fp32 scale = max|x| / 448 over what it covers):
 *   per-tensor        one scale per tensor;
 *   per-block         one per block of BLOCK rows of a head (Q tiles and K/V tiles of BLOCK rows);
 *   per-block + H     the same after Q and K are multiplied by the same random-sign Hadamard matrix
 *                     (fp8.h: incoherent processing; V is not transformed);
 * and, as the baseline, fp16: Q, K, V in fp16, P rounded to fp16 for P V (the fp16 stages' way).
 * The inputs are the stages' (make_inputs, fp16), with --outliers F: channels of Q and K
 * multiplied by F in every row (add_outliers, fp8.h), the case incoherent processing is for.
 * Prints the RMSE of O against the oracle for each, and its ratio to per-tensor FP8's.
 * Build: make bench/fp8_error. Run: bench/fp8_error --seqlen 1024 --dim 128 --outliers 50
 * (B = 1, H = 4 by default; OpenMP over the heads' rows). */
#include "common/fp8.h"
#include "common/half.h"
#include "common/harness.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum mode { FP16, PER_TENSOR, PER_BLOCK, PER_BLOCK_H, N_MODES };
static const char *mode_name[N_MODES] = {"fp16 (P in fp16)", "fp8, a scale per tensor", "fp8, a scale per block",
                                         "fp8, per block + Hadamard"};

/* One head's O [N][d] the emulated way (fp8_forward_row, common/fp8.h), a row at a time. */
static void head_forward(const struct fp8_head *hd, int N, int causal, float scale, double *o)
{
#pragma omp parallel
    {
        float *S = malloc((size_t)N * sizeof(float));
#pragma omp for schedule(dynamic, 16)
        for (int i = 0; i < N; i++)
            fp8_forward_row(hd, i, causal ? i + 1 : N, scale, S, o + (size_t)i * hd->d, NULL, NULL);
        free(S);
    }
}

int main(int argc, char **argv)
{
    int N = 1024, d = 128, H = 4, block = FP8_BLOCK_ROWS; /* the stage's blocks */
    float outliers = 50.0f;
    for (int a = 1; a < argc; a++) {
        const char *v = a + 1 < argc ? argv[a + 1] : NULL;
        if (!strcmp(argv[a], "--seqlen") && v) N = atoi(v), a++;
        else if (!strcmp(argv[a], "--dim") && v) d = atoi(v), a++;
        else if (!strcmp(argv[a], "--heads") && v) H = atoi(v), a++;
        else if (!strcmp(argv[a], "--block") && v) block = atoi(v), a++;
        else if (!strcmp(argv[a], "--outliers") && v) outliers = (float)atof(v), a++;
        else {
            fprintf(stderr, "usage: bench/fp8_error [--seqlen N] [--dim 64|128|256] [--heads H] [--block R] [--outliers F]\n");
            return 2;
        }
    }
    if (N < 1 || H < 1 || block < 1 || (d != 64 && d != 128 && d != 256) || !(outliers >= 1.0f)) {
        fprintf(stderr, "fp8_error: N, H, block >= 1; d 64, 128 or 256; --outliers F >= 1 (1: none)\n");
        return 2;
    }
    printf("fp8_error: B = 1, H = %d, N = %d, d = %d, inputs uniform in [-1, 1] (fp16), %d channels of Q and K x %g, "
           "blocks of %d rows\n\n", H, N, d, OUTLIER_CHANNELS, outliers, block);
    printf("| causal | quantization | RMSE of O | over per-tensor fp8 |\n|---|---|---|---|\n");
    for (int causal = 0; causal <= 1; causal++) {
        struct shape sh = {.B = 1, .H = H, .N = N, .d = d, .causal = causal, .scale = 1.0f / sqrtf((float)d)};
        const size_t n = shape_elems(&sh), rows = shape_rows(&sh);
        float *Q = malloc(n * sizeof(float)), *K = malloc(n * sizeof(float)), *V = malloc(n * sizeof(float));
        make_inputs(&sh, 1, 1.0f, DT_F16, Q, K, V);
        if (outliers > 1.0f) add_outliers(&sh, outliers, DT_F16, Q, K);
        double *Oref = malloc(n * sizeof(double)), *Lref = malloc(rows * sizeof(double));
        oracle_forward(&sh, Q, K, V, Oref, Lref);
        double rmse[N_MODES];
        float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
        float *sq = malloc(rows * sizeof(float)), *sk = malloc(rows * sizeof(float)), *sv = malloc(rows * sizeof(float));
        double *o = malloc((size_t)N * d * sizeof(double));
        for (int mode = 0; mode < N_MODES; mode++) {
            memcpy(q, Q, n * sizeof(float)), memcpy(k, K, n * sizeof(float)), memcpy(v, V, n * sizeof(float));
            /* per-tensor: one scale for the whole tensor (every head), spread to every row */
            if (mode == PER_TENSOR) {
                float s3[3];
                fp8_quantize(q, rows, d, rows, &s3[0]), fp8_quantize(k, rows, d, rows, &s3[1]);
                fp8_quantize(v, rows, d, rows, &s3[2]);
                for (size_t r = 0; r < rows; r++) sq[r] = s3[0], sk[r] = s3[1], sv[r] = s3[2];
            }
            /* fp16: the inputs as they are, scales of 1, P rounded to fp16 */
            if (mode == FP16)
                for (size_t r = 0; r < rows; r++) sq[r] = sk[r] = sv[r] = 1.0f;
            double se = 0.0;
            for (int h = 0; h < H; h++) {
                const size_t off = (size_t)h * N * d;
                /* per tensor and fp16: one scale a head (block = N); per block: the head quantized
                 * in blocks of `block` rows, after the Hadamard transform of Q and K for "+ H" */
                struct fp8_head hd = {.d = d, .block = N, .p_dtype = mode == FP16 ? DT_F16 : DT_FP8,
                                      .q = q + off, .k = k + off, .v = v + off, .sq = sq, .sk = sk, .sv = sv,
                                      .sv_max = sv[0]}; /* one V scale a head: per tensor, or fp16's 1 */
                if (mode == PER_BLOCK || mode == PER_BLOCK_H)
                    fp8_head_quantize(&hd, &sh, Q, K, V, 0, h, block, mode == PER_BLOCK_H);
                head_forward(&hd, N, causal, sh.scale, o);
                if (mode == PER_BLOCK || mode == PER_BLOCK_H) fp8_head_free(&hd);
                for (size_t e = 0; e < (size_t)N * d; e++) {
                    const double diff = o[e] - Oref[off + e];
                    se += diff * diff;
                }
            }
            rmse[mode] = sqrt(se / (double)n);
        }
        for (int mode = 0; mode < N_MODES; mode++)
            printf("| %s | %s | %.3e | %.3f |\n", causal ? "yes" : "no", mode_name[mode], rmse[mode], rmse[mode] / rmse[PER_TENSOR]);
        free(Q), free(K), free(V), free(Oref), free(Lref), free(q), free(k), free(v), free(sq), free(sk), free(sv), free(o);
    }
    return 0;
}
