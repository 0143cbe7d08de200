/* fp8_error.c: what FP8 does to attention's accuracy, before a kernel exists: the FP8 stage's
 * arithmetic emulated on the CPU, its error against the fp64 oracle, per way of quantizing.
 *
 * For each (batch, head), causal or not, the forward is computed as the FP8 stage computes it:
 *   Q, K, V quantized to e4m3 with fp32 scales (below); S = sQ sK (Q8 K8^T), fp32 sums;
 *   m = rowmax(S), P = exp(scale (S - m)) in fp32, l = rowsum(P) in fp32;
 *   P carried into P V as e4m3(256 P): P <= 1, and 256 P <= 256 < 448 keeps its small values out of
 *   e4m3's subnormals (a free factor for the kernel: exp2(x + 8)); O = sum_j sV_j e4m3(256 P) V8 /
 *   (256 l), fp32 sums.
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

/* x [rows][d] quantized in place to e4m3 values (kept as floats, already divided by their scale),
 * with one scale per `block` rows (block = rows: one for all); scales[] gets them. */
static void quantize(float *x, size_t rows, int d, size_t block, float *scales)
{
    for (size_t r0 = 0; r0 < rows; r0 += block) {
        const size_t r1 = r0 + block < rows ? r0 + block : rows;
        float amax = 0.0f;
        for (size_t e = r0 * d; e < r1 * d; e++) amax = fmaxf(amax, fabsf(x[e]));
        const float s = amax > 0.0f ? amax / E4M3_MAX : 1.0f;
        for (size_t e = r0 * d; e < r1 * d; e++) x[e] = e4m3_to_f32(f32_to_e4m3(x[e] / s));
        scales[r0 / block] = s;
    }
}

/* One head's O [N][d] the emulated way. q, k, v: the head's rows, already transformed and
 * quantized (fp8 modes: e4m3 values with scales sq, sk, sv per block of `block` rows). */
static void head_forward(enum mode mode, int N, int d, int causal, float scale, const float *q, const float *k,
                         const float *v, const float *sq, const float *sk, const float *sv, int block, double *o)
{
#pragma omp parallel
    {
        float *S = malloc((size_t)N * sizeof(float));
        double *acc = malloc((size_t)d * sizeof(double));
#pragma omp for schedule(dynamic, 16)
        for (int i = 0; i < N; i++) {
            const int keys = causal ? i + 1 : N;
            float m = -INFINITY;
            for (int j = 0; j < keys; j++) {
                float dot = 0.0f; /* fp32 sums, as the tensor cores' */
                for (int c = 0; c < d; c++) dot += q[(size_t)i * d + c] * k[(size_t)j * d + c];
                S[j] = mode == FP16 ? dot : dot * sq[i / block] * sk[j / block];
                m = fmaxf(m, S[j]);
            }
            float l = 0.0f;
            for (int c = 0; c < d; c++) acc[c] = 0.0;
            for (int j = 0; j < keys; j++) {
                const float P = expf(scale * (S[j] - m));
                l += P;
                const float Pq = mode == FP16 ? round_to_dtype(P, DT_F16) : e4m3_to_f32(f32_to_e4m3(256.0f * P)) / 256.0f;
                const float w = mode == FP16 ? Pq : Pq * sv[j / block];
                for (int c = 0; c < d; c++) acc[c] += (double)(w * v[(size_t)j * d + c]);
            }
            for (int c = 0; c < d; c++) o[(size_t)i * d + c] = acc[c] / l;
        }
        free(S), free(acc);
    }
}

int main(int argc, char **argv)
{
    int N = 1024, d = 128, H = 4, block = 128;
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
        int8_t *signs = malloc(d);
        hadamard_signs(signs, d, 1);
        for (int mode = 0; mode < N_MODES; mode++) {
            memcpy(q, Q, n * sizeof(float)), memcpy(k, K, n * sizeof(float)), memcpy(v, V, n * sizeof(float));
            if (mode == PER_BLOCK_H) hadamard_rows(q, rows, d, signs), hadamard_rows(k, rows, d, signs);
            /* per-tensor: one scale for the whole tensor (every head), spread to every block */
            if (mode == PER_TENSOR) {
                float s3[3];
                quantize(q, rows, d, rows, &s3[0]), quantize(k, rows, d, rows, &s3[1]), quantize(v, rows, d, rows, &s3[2]);
                for (size_t r = 0; r < rows; r++) sq[r] = s3[0], sk[r] = s3[1], sv[r] = s3[2];
            }
            double se = 0.0;
            for (int h = 0; h < H; h++) {
                const size_t off = (size_t)h * N * d;
                float hs[3] = {1.0f, 1.0f, 1.0f};
                const float *hq = sq, *hk = sk, *hv = sv;
                int hb = block;
                if (mode == PER_BLOCK || mode == PER_BLOCK_H) {
                    quantize(q + off, N, d, block, sq), quantize(k + off, N, d, block, sk), quantize(v + off, N, d, block, sv);
                } else if (mode == FP16) {
                    hq = hk = hv = hs, hb = N; /* unused scales of 1 */
                } else {
                    hb = N; /* per tensor: sq[0], sk[0], sv[0] hold the tensor's scales */
                }
                head_forward((enum mode)mode, N, d, causal, sh.scale, q + off, k + off, v + off, hq, hk, hv, hb, o);
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
        free(signs);
    }
    return 0;
}
