/* oracle.c: attention in fp64, the ground truth that stage 1 is checked against (and that the
 * harness samples rows of on shapes too large for stage 1). Written for clarity, not speed, but
 * for oracle_backward_head, whose plain form is oracle_backward. */
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

/* oracle_backward's sums for one head, arranged for speed (the harness checks a large shape's
 * gradients against three heads of it, N^2 d each; 1.7x the plain loops' speed): blocks of BLK
 * queries x BLK keys whose scores, P and dS go into small fp64 arrays, and every product as a
 * loop whose inner index runs along a row (vectorizable, no reduction in it). Two passes, so that
 * no thread adds into another's rows: over query blocks, O_i and L_i by the online softmax, D_i,
 * then dQ_i; over key blocks, dK_j and dV_j (the scores made again). The same sums as
 * oracle_backward in another order: tests/test_oracle.c (oracle::backward_head) holds them
 * within 1e-12 of the largest gradient. */
enum { BLK = 32 };

/* One block of scores of the head: S = scale Q_blk K_blk^T, P = exp(S - L) (0 where causal masks
 * it), dP = dO_blk V_blk^T, dS = P (dP - D), for queries i0 .. i0+ni-1 and keys j0 .. j0+nj-1;
 * q, g: [BLK][d] and kT, vT: [d][BLK] in fp64 (K and V transposed so that the inner loop runs
 * along keys). */
static void score_block(const struct shape *sh, const double *q, const double *g, const double *kT,
                        const double *vT, const double *L, const double *D, int i0, int ni, int j0, int nj,
                        double P[BLK][BLK], double dS[BLK][BLK])
{
    const int d = sh->d;
    for (int i = 0; i < ni; i++) {
        double s[BLK] = {0}, dp[BLK] = {0};
        for (int c = 0; c < d; c++) {
            const double qc = q[(size_t)i * d + c], gc = g[(size_t)i * d + c];
            const double *kc = kT + (size_t)c * BLK, *vc = vT + (size_t)c * BLK;
#pragma omp simd
            for (int j = 0; j < nj; j++) s[j] += qc * kc[j], dp[j] += gc * vc[j];
        }
        for (int j = 0; j < nj; j++) {
            const int masked = sh->causal && j0 + j > i0 + i;
            P[i][j] = masked ? 0 : exp(s[j] * sh->scale - L[i0 + i]);
            dS[i][j] = P[i][j] * (dp[j] - D[i0 + i]);
        }
    }
}

/* rows r0 .. r0+n-1 of a head's [N, d] tensor x as fp64, row-major [BLK][d], or transposed [d][BLK] */
static void rows_f64(const float *x, int d, int r0, int n, double *out)
{
    for (int r = 0; r < n; r++)
        for (int c = 0; c < d; c++) out[(size_t)r * d + c] = x[(size_t)(r0 + r) * d + c];
}
static void rows_f64_T(const float *x, int d, int r0, int n, double *out)
{
    for (int r = 0; r < n; r++)
        for (int c = 0; c < d; c++) out[(size_t)c * BLK + r] = x[(size_t)(r0 + r) * d + c];
}

void oracle_backward_head(const struct shape *sh, const float *Q, const float *K, const float *V,
                          const float *dO, int b, int h, double *dQ, double *dK, double *dV)
{
    const int N = sh->N, d = sh->d, nb = (N + BLK - 1) / BLK;
    const float *Qh = Q + idx4(sh, b, h, 0, 0), *Kh = K + idx4(sh, b, h, 0, 0), *Vh = V + idx4(sh, b, h, 0, 0);
    const float *dOh = dO + idx4(sh, b, h, 0, 0);
    double *L = malloc(sizeof(double) * (size_t)N), *D = malloc(sizeof(double) * (size_t)N);
#pragma omp parallel
    {
        const size_t blk = (size_t)BLK * d * sizeof(double);
        double *a = malloc(blk), *g = malloc(blk), *bT = malloc(blk), *cT = malloc(blk), *e = malloc(blk);
        double (*P)[BLK] = malloc(sizeof(double[BLK][BLK])), (*dS)[BLK] = malloc(sizeof(double[BLK][BLK]));
        /* a block of queries at a time: first O_i and L_i by the online softmax over the key
         * blocks (O_i kept in dQ_i's rows until D_i = rowsum(dO_i * O_i) is taken), then
         * dQ_i = scale sum_j dS_ij K_j */
#pragma omp for schedule(dynamic, 1)
        for (int ib = 0; ib < nb; ib++) {
            const int i0 = ib * BLK, ni = N - i0 < BLK ? N - i0 : BLK;
            rows_f64(Qh, d, i0, ni, a), rows_f64(dOh, d, i0, ni, g);
            double *dq = dQ + (size_t)i0 * d, m[BLK], l[BLK];
            for (size_t k = 0; k < (size_t)ni * d; k++) dq[k] = 0;
            for (int i = 0; i < ni; i++) m[i] = -INFINITY, l[i] = 0;
            for (int jb = 0; jb < nb; jb++) {
                const int j0 = jb * BLK, nj = N - j0 < BLK ? N - j0 : BLK;
                if (sh->causal && j0 > i0 + ni - 1) break;
                rows_f64_T(Kh, d, j0, nj, bT), rows_f64(Vh, d, j0, nj, e);
                for (int i = 0; i < ni; i++) {
                    double *sc = P[i], mx = m[i];
                    for (int j = 0; j < nj; j++) sc[j] = 0;
                    for (int c = 0; c < d; c++) {
                        const double qc = a[(size_t)i * d + c], *kc = bT + (size_t)c * BLK;
#pragma omp simd
                        for (int j = 0; j < nj; j++) sc[j] += qc * kc[j];
                    }
                    for (int j = 0; j < nj; j++) {
                        sc[j] = sh->causal && j0 + j > i0 + i ? -INFINITY : sc[j] * sh->scale;
                        if (sc[j] > mx) mx = sc[j];
                    }
                    const double alpha = m[i] == -INFINITY ? 0 : exp(m[i] - mx);
                    double *oi = dq + (size_t)i * d;
                    l[i] *= alpha;
                    for (int c = 0; c < d; c++) oi[c] *= alpha;
                    for (int j = 0; j < nj; j++) {
                        const double p = sc[j] == -INFINITY ? 0 : exp(sc[j] - mx);
                        const double *vj = e + (size_t)j * d;
                        l[i] += p;
#pragma omp simd
                        for (int c = 0; c < d; c++) oi[c] += p * vj[c];
                    }
                    m[i] = mx;
                }
            }
            for (int i = 0; i < ni; i++) {
                double *oi = dq + (size_t)i * d, Di = 0;
                for (int c = 0; c < d; c++) Di += g[(size_t)i * d + c] * (oi[c] / l[i]);
                L[i0 + i] = m[i] + log(l[i]), D[i0 + i] = Di;
            }
            for (size_t k = 0; k < (size_t)ni * d; k++) dq[k] = 0;
            for (int jb = 0; jb < nb; jb++) {
                const int j0 = jb * BLK, nj = N - j0 < BLK ? N - j0 : BLK;
                if (sh->causal && j0 > i0 + ni - 1) break; /* every key after every query */
                rows_f64_T(Kh, d, j0, nj, bT), rows_f64_T(Vh, d, j0, nj, cT), rows_f64(Kh, d, j0, nj, e);
                score_block(sh, a, g, bT, cT, L, D, i0, ni, j0, nj, P, dS);
                for (int i = 0; i < ni; i++)
                    for (int j = 0; j < nj; j++) {
                        const double w = sh->scale * dS[i][j];
                        const double *kj = e + (size_t)j * d;
                        double *dqi = dq + (size_t)i * d;
#pragma omp simd
                        for (int c = 0; c < d; c++) dqi[c] += w * kj[c];
                    }
            }
        }
        /* dK_j = scale sum_i dS_ij Q_i, dV_j = sum_i P_ij dO_i, a block of keys at a time */
#pragma omp for schedule(dynamic, 1)
        for (int jb = 0; jb < nb; jb++) {
            const int j0 = jb * BLK, nj = N - j0 < BLK ? N - j0 : BLK;
            rows_f64_T(Kh, d, j0, nj, bT), rows_f64_T(Vh, d, j0, nj, cT);
            double *dk = dK + (size_t)j0 * d, *dv = dV + (size_t)j0 * d;
            for (size_t k = 0; k < (size_t)nj * d; k++) dk[k] = dv[k] = 0;
            for (int ib = sh->causal ? jb : 0; ib < nb; ib++) { /* (causal: no query before key j0 sees it) */
                const int i0 = ib * BLK, ni = N - i0 < BLK ? N - i0 : BLK;
                rows_f64(Qh, d, i0, ni, a), rows_f64(dOh, d, i0, ni, g);
                score_block(sh, a, g, bT, cT, L, D, i0, ni, j0, nj, P, dS);
                for (int j = 0; j < nj; j++)
                    for (int i = 0; i < ni; i++) {
                        const double p = P[i][j], w = sh->scale * dS[i][j];
                        const double *qi = a + (size_t)i * d, *gi = g + (size_t)i * d;
                        double *dvj = dv + (size_t)j * d, *dkj = dk + (size_t)j * d;
#pragma omp simd
                        for (int c = 0; c < d; c++) dvj[c] += p * gi[c], dkj[c] += w * qi[c];
                    }
            }
        }
        free(a), free(g), free(bT), free(cT), free(e), free(P), free(dS);
    }
    free(L), free(D);
}
