/* 02_tiled_cpu.c: attention in tiles, never holding the N x N score matrix.
 *
 * Changed from stage 1: Q is cut into row tiles Q_i (Br rows) and K, V into column tiles K_j, V_j
 *   (Bc rows). For one Q tile, the softmax needs the row max over ALL keys before any exp, so
 *   the K tiles are swept twice:
 *     pass 1:  m_i = max_j rowmax(S_ij),                       S_ij = scale * Q_i K_j^T
 *     pass 2:  P_ij = exp(S_ij - m_i),  l_i += rowsum(P_ij),  O_i += P_ij V_j
 *     then     O_i /= l_i,  L_i = m_i + log(l_i)
 *   (the row sum rides along in pass 2, once m_i is final).
 * Why: scratch is one Br x Bc tile of S, K_j and V_j packed, and the Br x d accumulator per
 *   thread, O(tile) instead of O(N^2): the idea FlashAttention is built on. The price: every S_ij
 *   is computed twice.
 * The two products are blocked for the cache and the registers (see the configuration): K_j is
 *   packed transposed and V_j padded once per tile, so the inner loops run along contiguous
 *   memory, and each micro-tile of S_ij or O_i is summed in registers. The exponentials of a row
 *   are computed together by exp_row, with exp_fast: a small exp in plain C that vectorizes.
 * Work is spread over OpenMP threads by (batch, head, Q tile).
 * Measured on a 2-core AMD EPYC, d=64: see notes/02_tiled_cpu.md.
 * Run: ./stage2 --seqlen 4096 --dim 64 --causal
 */
#include "common/attn.h"
#include "common/mem.h"
#include <math.h>
#include <stdint.h>
#include <string.h>

/* ---- configuration ---- */
/* Tiles sized from one core's caches (L1d 32 KiB; L2 512 KiB to 1 MiB on the x86 cores we run on):
 *   Br x Bc = 64 x 64 fp32: the S_ij tile is 16 KiB and stays in L1 while it is written, turned
 *     into P_ij and read back by the P_ij V_j product;
 *   K_j^T packed (d x Bc), V_j packed (Bc x dp) and the O_i accumulator (Br x dp) are 16 KiB
 *     each at d = 64, 64 KiB each at d = 256: with S_ij they fit in L2 (at most 208 KiB), so
 *     after one fetch per Q tile K_j and V_j are served from L2 to all Br rows;
 *   a larger Bc would push S_ij out of L1; a larger Br would read K_j, V_j fewer times but
 *     overflows a 512 KiB L2 at d = 256.
 * The micro-tile MR x NR = 4 x 16 (of S_ij, or of O_i) is what lives in registers: 64 sums, 8 of
 * the 16 AVX registers (8 floats each) in the x86-64-v3 clone (see CLONES), enough independent
 * multiply-adds to hide the FMA latency (4 cycles, 2 per cycle). Each step of the inner loop
 * loads NR floats of K_j^T (2 vectors) and MR floats of Q_i (broadcast) and does
 * 2 * MR * NR = 128 FLOPs: 21 FLOPs per load, where a dot product does 1 and waits on its one
 * sum. (The SSE2 clone holds the same 64 sums in 16 registers of 4 floats and spills some.) */
#define Br 64
#define Bc 64
#define MR 4 /* micro-tile rows: Br is a multiple of it */
#define NR 16 /* micro-tile columns: Bc is a multiple of it, and so is dp (d rounded up) */
_Static_assert(Br % MR == 0 && Bc % NR == 0, "micro-tiles must tile S_ij");

/* exp_fast's constants: exp(x) = 2^k * exp(r), k = round(x * LOG2E), r = x - k ln 2 */
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f     /* ln 2 = LN2_HI + LN2_LO; k * LN2_HI is exact for |k| < 2^9 */
#define LN2_LO -2.12194440e-4f
#define ROUND_MAGIC 12582912.0f /* 1.5 * 2^23: t + ROUND_MAGIC rounds t to an integer, held in
                                   the low bits of the float (0x4B400000 + k) */
#define EXP_LO -87.33654f       /* exp(EXP_LO) = 2^-126, the smallest normal: at or below, 0 */

/* CLONES: the three hot helpers are compiled twice, for x86-64-v3 (AVX2 and FMA: 8-float vectors,
 * a multiply-add in one instruction) and for plain x86-64 (SSE2, 4 floats), and the program picks
 * one when it starts, from what the processor has (gcc's target_clones, an ifunc). The Makefile's
 * -O2 stays portable, where -march=native would build for this machine only; without the clones
 * -O2 means SSE2 and the products run at half the vector width (notes/02_tiled_cpu.md).
 * gcc only: clang (14 at least) gives a static function's ifunc resolver external linkage, so the
 * helpers of stages 2 and 3, of the same names, collide where both are linked (the test program). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define CLONES
#endif

/* ---- tiles ---- */

/* exp(x) for fp32 and EXP_LO <= x <= 0 (the caller clamps), branch-free so that a loop of it
 * vectorizes (expf does not, without -ffast-math): Cody-Waite range reduction to |r| <= ln2/2,
 * then Cephes' polynomial for exp(r), and 2^k built in the exponent bits. Relative error
 * < 1e-7 against exp in double (8.3e-8 measured over [-87.3, 0]); x = EXP_LO gives 0. */
static inline float exp_fast(float x)
{
    float t = x * LOG2E + ROUND_MAGIC;
    float k = t - ROUND_MAGIC;
    float r = (x - k * LN2_HI) - k * LN2_LO;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    int32_t t_bits, k_bits;
    float two_k;
    memcpy(&t_bits, &t, sizeof t_bits);   /* t_bits = 0x4B400000 + k */
    k_bits = (t_bits - 0x4B400000 + 127) << 23; /* the bits of the float 2^k */
    k_bits = x <= EXP_LO ? 0 : k_bits;          /* 2^k = 0: exp(-inf) = 0 */
    memcpy(&two_k, &k_bits, sizeof two_k);
    return p * two_k;
}

/* K_j^T, packed: Kt[e * Bc + c] = K[j0 + c][e], zero past the tile's bc keys, so the score loop
 * runs along contiguous memory for every e. */
static void pack_kt(const float *K, int d, int j0, int bc, float *Kt)
{
    for (int c = 0; c < Bc; c++)
        for (int e = 0; e < d; e++) Kt[e * Bc + c] = c < bc ? K[(size_t)(j0 + c) * d + e] : 0;
}

/* V_j, padded: Vp[c * dp + e] = V[j0 + c][e], zero for d <= e < dp, so O_i's micro-tiles are
 * whole. */
static void pack_v(const float *V, int d, int dp, int j0, int bc, float *Vp)
{
    for (int c = 0; c < bc; c++)
        for (int e = 0; e < dp; e++) Vp[c * dp + e] = e < d ? V[(size_t)(j0 + c) * d + e] : 0;
}

/* S_ij = scale * Q_i K_j^T for rows i0..i0+br-1 and keys j0..j0+bc-1, masked to -inf above the
 * diagonal when causal and past the tile's bc keys. Rows br..Br-1 repeat row br-1 (a micro-tile
 * is always whole), so every row of S_ij holds finite scores or -inf. */
CLONES static void scores(const struct shape *sh, const float *Q, const float *Kt, int i0, int br,
                          int j0, int bc, float *S_ij)
{
    int d = sh->d;
    for (int r0 = 0; r0 < br; r0 += MR) {
        const float *q[MR];
        int last[MR]; /* the last key each row may see */
        for (int r = 0; r < MR; r++) {
            int i = i0 + (r0 + r < br ? r0 + r : br - 1);
            q[r] = Q + (size_t)i * d;
            last[r] = sh->causal ? i - j0 : bc - 1;
            if (last[r] > bc - 1) last[r] = bc - 1;
        }
        for (int c0 = 0; c0 < Bc; c0 += NR) {
            /* the MR x NR micro-tile of S_ij, summed in registers over e */
            float acc[MR][NR] = {{0}};
            if (c0 < bc)
                for (int e = 0; e < d; e++) {
                    const float *kt = Kt + e * Bc + c0;
#pragma GCC unroll 4 /* MR: every acc[r][c] stays a register */
                    for (int r = 0; r < MR; r++) {
                        float q_re = q[r][e];
#pragma omp simd
                        for (int c = 0; c < NR; c++) acc[r][c] += q_re * kt[c];
                    }
                }
            for (int r = 0; r < MR; r++) {
                float *s = S_ij + (r0 + r) * Bc + c0;
#pragma omp simd
                for (int c = 0; c < NR; c++) {
                    float mask = c0 + c > last[r] ? -INFINITY : 0.0f;
                    s[c] = acc[r][c] * sh->scale + mask;
                }
            }
        }
    }
}

/* O_i += P_ij V_j for the first `rows` rows: the same micro-tiles, MR rows of O_i by NR of its
 * dp columns, summed in registers over the bc keys. */
CLONES static void accumulate_pv(const float *P_ij, const float *Vp, int rows, int bc, int dp,
                                 float *O_i)
{
    for (int r0 = 0; r0 < rows; r0 += MR)
        for (int e0 = 0; e0 < dp; e0 += NR) {
            float acc[MR][NR];
            for (int r = 0; r < MR; r++)
#pragma omp simd
                for (int e = 0; e < NR; e++) acc[r][e] = O_i[(r0 + r) * dp + e0 + e];
            for (int c = 0; c < bc; c++) {
                const float *v = Vp + c * dp + e0;
#pragma GCC unroll 4 /* MR: every acc[r][e] stays a register */
                for (int r = 0; r < MR; r++) {
                    float p = P_ij[(r0 + r) * Bc + c];
#pragma omp simd
                    for (int e = 0; e < NR; e++) acc[r][e] += p * v[e];
                }
            }
            for (int r = 0; r < MR; r++)
#pragma omp simd
                for (int e = 0; e < NR; e++) O_i[(r0 + r) * dp + e0 + e] = acc[r][e];
        }
}

/* m = rowmax(S_r) over a whole row of the tile (masked entries are -inf) */
static inline float row_max(const float *S_r)
{
    float m = -INFINITY;
#pragma omp simd reduction(max : m)
    for (int c = 0; c < Bc; c++) m = S_r[c] > m ? S_r[c] : m;
    return m;
}

/* P_r = exp(S_r - m) in place, all Bc together (exp(-inf) = 0 where masked); returns rowsum(P_r).
 * The clamp to EXP_LO is a loop of its own: inside exp_fast's loop gcc would thread the constant
 * through the polynomial, branch, and not vectorize (the FP ops may trap, -ftrapping-math). */
CLONES static float exp_row(float *S_r, float m)
{
#pragma omp simd
    for (int c = 0; c < Bc; c++) {
        float x = S_r[c] - m;
        S_r[c] = x < EXP_LO ? EXP_LO : x;
    }
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int c = 0; c < Bc; c++) {
        S_r[c] = exp_fast(S_r[c]);
        sum += S_r[c];
    }
    return sum;
}

static int forward(const struct attn_args *a, char *why, size_t n)
{
    (void)why, (void)n;
    const struct shape *sh = &a->sh;
    int N = sh->N, d = sh->d, Tr = CEIL_DIV(N, Br), dp = CEIL_DIV(d, NR) * NR;
    long tiles = (long)sh->B * sh->H * Tr;
#pragma omp parallel
    {
        /* per-thread scratch: one tile of S, K_j^T and V_j packed, the O_i
         * accumulator, m_i, l_i */
        float *S_ij = mem_alloc(sizeof(float) * Br * Bc);
        float *Kt = mem_alloc(sizeof(float) * d * Bc);
        float *Vp = mem_alloc(sizeof(float) * Bc * dp);
        float *O_i = mem_alloc(sizeof(float) * Br * dp);
        float m_i[Br], l_i[Br];
#pragma omp for schedule(dynamic)
        for (long t = 0; t < tiles; t++) {
            int bh = (int)(t / Tr), i0 = (int)(t % Tr) * Br;
            int br = N - i0 < Br ? N - i0 : Br;
            int rows = CEIL_DIV(br, MR) * MR; /* whole micro-tiles; rows past br repeat row br-1 */
            size_t off = (size_t)bh * N * d;
            const float *Q = (const float *)a->Q + off, *K = (const float *)a->K + off;
            const float *V = (const float *)a->V + off;
            /* causal: keys past this tile's last row are masked for every row, skip their tiles */
            int kend = sh->causal ? i0 + br : N;

            /* pass 1: m_i = max over all K tiles of rowmax(S_ij) */
            for (int r = 0; r < rows; r++) m_i[r] = -INFINITY;
            for (int j0 = 0; j0 < kend; j0 += Bc) {
                int bc = kend - j0 < Bc ? kend - j0 : Bc;
                pack_kt(K, d, j0, bc, Kt);
                scores(sh, Q, Kt, i0, br, j0, bc, S_ij);
                for (int r = 0; r < rows; r++) m_i[r] = fmaxf(m_i[r], row_max(S_ij + r * Bc));
            }

            /* pass 2: P_ij = exp(S_ij - m_i), l_i += rowsum(P_ij), O_i += P_ij V_j */
            for (int r = 0; r < rows; r++) l_i[r] = 0;
            for (int e = 0; e < rows * dp; e++) O_i[e] = 0;
            for (int j0 = 0; j0 < kend; j0 += Bc) {
                int bc = kend - j0 < Bc ? kend - j0 : Bc;
                pack_kt(K, d, j0, bc, Kt);
                pack_v(V, d, dp, j0, bc, Vp);
                scores(sh, Q, Kt, i0, br, j0, bc, S_ij); /* recomputed: the two-pass price */
                for (int r = 0; r < rows; r++) /* 0 where masked */
                    l_i[r] += exp_row(S_ij + r * Bc, m_i[r]);
                accumulate_pv(S_ij, Vp, rows, bc, dp, O_i);
            }

            /* O_i /= l_i, L_i = m_i + log(l_i): every row sees key 0, so l_i >= 1 */
            for (int r = 0; r < br; r++) {
                float *out = (float *)a->O + off + (size_t)(i0 + r) * d;
                for (int e = 0; e < d; e++) out[e] = O_i[r * dp + e] / l_i[r];
                a->L[(size_t)bh * N + i0 + r] = m_i[r] + logf(l_i[r]);
            }
        }
        mem_free(S_ij);
        mem_free(Kt);
        mem_free(Vp);
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
