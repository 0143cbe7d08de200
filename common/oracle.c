/* oracle.c: attention in fp64, the ground truth that stage 1 is checked against (and that the
 * harness samples rows of on shapes too large for stage 1). Written for clarity, not speed. */
#include "harness.h"
#include <math.h>
#include <stdlib.h>

/* o = softmax(scale * q_i K^T) V for one row, masked by causality; lse = log sum exp. The row
 * reads its KV head, hk = h / (H / H_kv), and the keys 0 .. keys_seen(i) - 1 of its N_kv. */
void oracle_forward_row(const struct shape *sh, const float *Q, const float *K, const float *V,
                        int b, int h, int i, double *o, double *lse)
{
    int d = sh->d, hk = kv_head_of(sh, h);
    int kend = keys_seen(sh, i); /* keys 0..kend-1 are visible */
    double *s = malloc(sizeof(double) * (size_t)(kend > 0 ? kend : 1));
    const float *q = Q + idx4(sh, b, h, i, 0);
    double m = -INFINITY;
    for (int j = 0; j < kend; j++) {
        const float *k = K + idx4_kv(sh, b, hk, j, 0);
        double dot = 0;
        for (int c = 0; c < d; c++) dot += (double)q[c] * k[c];
        s[j] = dot * sh->scale;
        if (s[j] > m) m = s[j];
    }
    double sum = 0;
    for (int c = 0; c < d; c++) o[c] = 0;
    for (int j = 0; j < kend; j++) {
        double p = exp(s[j] - m);
        sum += p;
        const float *v = V + idx4_kv(sh, b, hk, j, 0);
        for (int c = 0; c < d; c++) o[c] += p * v[c];
    }
    for (int c = 0; c < d; c++) o[c] /= sum;
    *lse = m + log(sum);
    free(s);
}

void oracle_forward(const struct shape *sh, const float *Q, const float *K, const float *V,
                    double *O, double *L)
{
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++)
            for (int i = 0; i < sh->N; i++)
                oracle_forward_row(sh, Q, K, V, b, h, i, O + idx4(sh, b, h, i, 0), L + idx3(sh, b, h, i));
}

/* With P = softmax(S), O = P V and the loss sum(dO * O):
 *   dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dO * O)),  dQ = scale dS K,  dK = scale dS^T Q */
void oracle_backward(const struct shape *sh, const float *Q, const float *K, const float *V,
                     const float *dO, double *dQ, double *dK, double *dV)
{
    int N = sh->N, d = sh->d;
    double *o = malloc(sizeof(double) * (size_t)d);
    for (size_t k = 0; k < shape_elems(sh); k++) dQ[k] = dK[k] = dV[k] = 0;
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++)
            for (int i = 0; i < N; i++) {
                double lse; /* O_i and L_i, recomputed in fp64 */
                oracle_forward_row(sh, Q, K, V, b, h, i, o, &lse);
                const float *q = Q + idx4(sh, b, h, i, 0), *g = dO + idx4(sh, b, h, i, 0);
                double D = 0; /* D_i = rowsum(dO_i * O_i) */
                for (int c = 0; c < d; c++) D += (double)g[c] * o[c];
                int kend = sh->causal ? i + 1 : N;
                for (int j = 0; j < kend; j++) {
                    const float *k = K + idx4(sh, b, h, j, 0), *v = V + idx4(sh, b, h, j, 0);
                    double dot = 0, dp = 0;
                    for (int c = 0; c < d; c++) {
                        dot += (double)q[c] * k[c];
                        dp += (double)g[c] * v[c];
                    }
                    double p = exp(dot * sh->scale - lse); /* P_ij */
                    double ds = p * (dp - D);              /* dS_ij */
                    double *dq = dQ + idx4(sh, b, h, i, 0), *dk = dK + idx4(sh, b, h, j, 0),
                           *dv = dV + idx4(sh, b, h, j, 0);
                    for (int c = 0; c < d; c++) {
                        dv[c] += p * g[c];
                        dq[c] += sh->scale * ds * k[c];
                        dk[c] += sh->scale * ds * q[c];
                    }
                }
            }
    free(o);
}

void oracle_backward_head(const struct shape *sh, const float *Q, const float *K, const float *V,
                          const float *dO, int b, int h, double *dQ, double *dK, double *dV)
{
    const int N = sh->N, d = sh->d;
    const size_t nd = (size_t)N * d;
    for (size_t k = 0; k < nd; k++) dQ[k] = dK[k] = dV[k] = 0;
    const float *Qh = Q + idx4(sh, b, h, 0, 0), *Kh = K + idx4(sh, b, h, 0, 0), *Vh = V + idx4(sh, b, h, 0, 0);
    const float *dOh = dO + idx4(sh, b, h, 0, 0);
#pragma omp parallel
    {
        /* rows i are independent for dQ; dK and dV sum over i: each thread its own, added at the end */
        double *o = malloc(sizeof(double) * (size_t)d);
        double *dk = calloc(nd, sizeof(double)), *dv = calloc(nd, sizeof(double));
#pragma omp for schedule(dynamic, 16)
        for (int i = 0; i < N; i++) {
            double lse;
            oracle_forward_row(sh, Q, K, V, b, h, i, o, &lse);
            const float *q = Qh + (size_t)i * d, *g = dOh + (size_t)i * d;
            double D = 0;
            for (int c = 0; c < d; c++) D += (double)g[c] * o[c];
            int kend = sh->causal ? i + 1 : N;
            for (int j = 0; j < kend; j++) {
                const float *k = Kh + (size_t)j * d, *v = Vh + (size_t)j * d;
                double dot = 0, dp = 0;
                for (int c = 0; c < d; c++) {
                    dot += (double)q[c] * k[c];
                    dp += (double)g[c] * v[c];
                }
                double p = exp(dot * sh->scale - lse), ds = p * (dp - D);
                for (int c = 0; c < d; c++) {
                    dv[(size_t)j * d + c] += p * g[c];
                    dQ[(size_t)i * d + c] += sh->scale * ds * k[c];
                    dk[(size_t)j * d + c] += sh->scale * ds * q[c];
                }
            }
        }
#pragma omp critical
        for (size_t k = 0; k < nd; k++) dK[k] += dk[k], dV[k] += dv[k];
        free(o), free(dk), free(dv);
    }
}
