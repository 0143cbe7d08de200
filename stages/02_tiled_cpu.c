/* 02_tiled_cpu.c: attention in tiles, never holding the N x N score matrix.
 *
 * Changed from stage 1: Q is cut into row tiles Q_i (Br rows) and K, V into column tiles K_j, V_j
 *   (Bc rows). For one Q tile, the softmax needs the row max over ALL keys before any exp, so
 *   the K tiles are swept twice:
 *     pass 1:  m_i = max_j rowmax(S_ij),                       S_ij = scale * Q_i K_j^T
 *     pass 2:  P_ij = exp(S_ij - m_i),  l_i += rowsum(P_ij),  O_i += P_ij V_j
 *     then     O_i /= l_i,  L_i = m_i + log(l_i)
 *   (the row sum rides along in pass 2, once m_i is final).
 * Why: scratch is one Br x Bc tile of S plus the Br x d accumulator per thread, O(tile) instead of
 *   O(N^2): the idea FlashAttention is built on. The price: every S_ij is computed twice.
 * Work is spread over OpenMP threads by (batch, head, Q tile).
 * Run: ./stage2 --seqlen 4096 --dim 64 --causal
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
        /* per-thread scratch: one tile of S, the O_i accumulator, m_i and l_i */
        float *S_ij = mem_alloc(sizeof(float) * Br * Bc);
        float *O_i = mem_alloc(sizeof(float) * Br * d);
        float m_i[Br], l_i[Br];
#pragma omp for schedule(dynamic)
        for (long t = 0; t < tiles; t++) {
            int bh = (int)(t / Tr), i0 = (int)(t % Tr) * Br;
            int br = N - i0 < Br ? N - i0 : Br;
            size_t off = (size_t)bh * N * d;
            const float *Q = (const float *)a->Q + off, *K = (const float *)a->K + off;
            const float *V = (const float *)a->V + off;
            /* causal: keys past this tile's last row are masked for every row, skip their tiles */
            int kend = sh->causal ? i0 + br : N;

            /* pass 1: m_i = max over all K tiles of rowmax(S_ij) */
            for (int r = 0; r < br; r++) m_i[r] = -INFINITY;
            for (int j0 = 0; j0 < kend; j0 += Bc) {
                int bc = kend - j0 < Bc ? kend - j0 : Bc;
                scores(sh, Q, K, i0, br, j0, bc, S_ij);
                for (int r = 0; r < br; r++)
                    for (int c = 0; c < bc; c++) m_i[r] = fmaxf(m_i[r], S_ij[r * Bc + c]);
            }

            /* pass 2: P_ij = exp(S_ij - m_i), l_i += rowsum(P_ij), O_i += P_ij V_j */
            for (int r = 0; r < br; r++) l_i[r] = 0;
            for (int e = 0; e < br * d; e++) O_i[e] = 0;
            for (int j0 = 0; j0 < kend; j0 += Bc) {
                int bc = kend - j0 < Bc ? kend - j0 : Bc;
                scores(sh, Q, K, i0, br, j0, bc, S_ij); /* recomputed: the two-pass price */
                for (int r = 0; r < br; r++)
                    for (int c = 0; c < bc; c++) {
                        float p = expf(S_ij[r * Bc + c] - m_i[r]); /* 0 where masked */
                        l_i[r] += p;
                        const float *v = V + (size_t)(j0 + c) * d;
                        for (int e = 0; e < d; e++) O_i[r * d + e] += p * v[e];
                    }
            }

            /* O_i /= l_i, L_i = m_i + log(l_i): every row sees key 0, so l_i >= 1 */
            for (int r = 0; r < br; r++) {
                float *out = (float *)a->O + off + (size_t)(i0 + r) * d;
                for (int e = 0; e < d; e++) out[e] = O_i[r * d + e] / l_i[r];
                a->L[(size_t)bh * N + i0 + r] = m_i[r] + logf(l_i[r]);
            }
        }
        mem_free(S_ij);
        mem_free(O_i);
    }
    return 0;
}

/* ---- descriptor ---- */
const struct stage stage2_desc = {
    .name = "stage2",
    .idea = "tiled CPU: Q row tiles x K/V tiles, softmax in two passes, O(tile) memory",
    .device = ON_CPU,
    .forward = forward,
    .dims = {0}, /* any head dim */
    .dtypes = DT_F32,
    .openmp = 1,
};
