/* 03_online_softmax.c: one pass over the K/V tiles with a running max and sum (FA-1's math).
 *
 * Changed from stage 2: no first pass for the row max. Each row keeps a running max m_i and sum
 *   l_i, and O_i (kept normalized) is corrected as each K/V tile arrives:
 *     m~_ij = rowmax(S_ij),  P~_ij = exp(S_ij - m~_ij),  l~_ij = rowsum(P~_ij)
 *     m_new = max(m_i, m~_ij),  l_new = exp(m_i - m_new) l_i + exp(m~_ij - m_new) l~_ij
 *     O_i  = (l_i exp(m_i - m_new) O_i + exp(m~_ij - m_new) P~_ij V_j) / l_new
 *   These are exactly Algorithm 1's lines of the FlashAttention paper; stage 4 runs them on a GPU.
 * Why: S_ij is computed once instead of twice, and a K/V tile is read once per Q tile: the
 *   property that lets the GPU stages stream K and V through on-chip memory.
 * Work is spread over OpenMP threads by (batch, head, Q tile).
 * Run: ./stage3 --seqlen 4096 --dim 64 --causal
 */
#include "common/attn.h"
#include "common/mem.h"
#include <math.h>

/* ---- configuration ---- */
/* 64 x 64 fp32 tile of S is 16 KiB: it and a Br x d accumulator stay in a core's L1/L2. */
#define Br 64
#define Bc 64

/* ---- tiles ---- */

/* S_ij = scale * Q_i K_j^T for rows i0..i0+br-1 and keys j0..j0+bc-1, masked to -inf above the
 * diagonal when causal. */
static void scores(const struct shape *sh, const float *Q, const float *K, int i0, int br, int j0,
                          int bc, float *S_ij)
{
    for (int r = 0; r < br; r++)
        for (int c = 0; c < bc; c++) {
            int i = i0 + r, j = j0 + c;
            float *s = &S_ij[r * Bc + c];
            if (sh->causal && j > i) { *s = -INFINITY; continue; }
            const float *q = Q + (size_t)i * sh->d, *k = K + (size_t)j * sh->d;
            float dot = 0;
            for (int e = 0; e < sh->d; e++) dot += q[e] * k[e];
            *s = dot * sh->scale;
        }
}

static int forward(const struct attn_args *a, char *why, size_t n)
{
    (void)why, (void)n;
    const struct shape *sh = &a->sh;
    int N = sh->N, d = sh->d, Tr = CEIL_DIV(N, Br);
    long tiles = (long)sh->B * sh->H * Tr;
#pragma omp parallel
    {
        /* per-thread scratch: one tile of S (P~ in place), the O_i accumulator, m_i and l_i */
        float *S_ij = mem_alloc(sizeof(float) * Br * Bc);
        float *O_i = mem_alloc(sizeof(float) * Br * d);
        float *PV = mem_alloc(sizeof(float) * d);
        float m_i[Br], l_i[Br];
#pragma omp for schedule(dynamic)
        for (long t = 0; t < tiles; t++) {
            int bh = (int)(t / Tr), i0 = (int)(t % Tr) * Br;
            int br = N - i0 < Br ? N - i0 : Br;
            size_t off = (size_t)bh * N * d;
            const float *Q = (const float *)a->Q + off, *K = (const float *)a->K + off;
            const float *V = (const float *)a->V + off;
            int kend = sh->causal ? i0 + br : N; /* causal: later K tiles are masked for every row */

            for (int r = 0; r < br; r++) m_i[r] = -INFINITY, l_i[r] = 0;
            for (int e = 0; e < br * d; e++) O_i[e] = 0;
            for (int j0 = 0; j0 < kend; j0 += Bc) {
                int bc = kend - j0 < Bc ? kend - j0 : Bc;
                scores(sh, Q, K, i0, br, j0, bc, S_ij);
                for (int r = 0; r < br; r++) {
                    float *S_r = S_ij + r * Bc;
                    float m_tile = -INFINITY; /* m~_ij = rowmax(S_ij) */
                    for (int c = 0; c < bc; c++) m_tile = fmaxf(m_tile, S_r[c]);
                    if (m_tile == -INFINITY) continue; /* every key masked for this row: nothing to add */
                    float l_tile = 0; /* P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij) */
                    for (int e = 0; e < d; e++) PV[e] = 0;
                    for (int c = 0; c < bc; c++) {
                        float p = expf(S_r[c] - m_tile);
                        l_tile += p;
                        const float *v = V + (size_t)(j0 + c) * d;
                        for (int e = 0; e < d; e++) PV[e] += p * v[e]; /* P~_ij V_j, this row */
                    }
                    float m_new = fmaxf(m_i[r], m_tile);
                    float alpha = expf(m_i[r] - m_new), beta = expf(m_tile - m_new); /* exp(-inf) = 0 on the first tile */
                    float l_new = alpha * l_i[r] + beta * l_tile;
                    /* O_i = (l_i alpha O_i + beta P~ V_j) / l_new: FA-1 rescales and renormalizes every tile */
                    for (int e = 0; e < d; e++)
                        O_i[r * d + e] = (l_i[r] * alpha * O_i[r * d + e] + beta * PV[e]) / l_new;
                    m_i[r] = m_new;
                    l_i[r] = l_new;
                }
            }
            for (int r = 0; r < br; r++) { /* O_i is already normalized; L_i = m_i + log(l_i) */
                float *out = (float *)a->O + off + (size_t)(i0 + r) * d;
                for (int e = 0; e < d; e++) out[e] = O_i[r * d + e];
                a->L[(size_t)bh * N + i0 + r] = m_i[r] + logf(l_i[r]);
            }
        }
        mem_free(S_ij);
        mem_free(O_i);
        mem_free(PV);
    }
    return 0;
}

/* ---- descriptor ---- */
const struct stage stage3_desc = {
    .name = "stage3",
    .idea = "online softmax: one pass, running max m and sum l, O rescaled per K/V tile",
    .device = ON_CPU,
    .forward = forward,
    .dims = {0}, /* any head dim */
    .dtypes = DT_F32,
    .openmp = 1,
};
