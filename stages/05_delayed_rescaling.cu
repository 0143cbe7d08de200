/* 05_delayed_rescaling.cu: FlashAttention forward with delayed rescaling (FA-2 paper, section 3.1)
 *
 * Changed from stage 4: O_i stays unnormalized. As each K/V tile arrives the O_i accumulated so
 *   far is only corrected by exp(m_i - m_new); the division by l_i happens once, on the last K/V
 *   tile a Q tile sees, when L = m + log(l) is written for the backward.
 * Why: stage 4 divides every O row by l_new on every step (and multiplies it back by l_i on the
 *   next). On the GPU those are non-matmul FLOPs, many times dearer than tensor-core FLOPs, and
 *   FA-2 removes them first. Everything else is stage 4's: the loop order (K/V outer, Q inner), one
 *   block per (batch, head), sliced-K warps, and O_i, l_i, m_i through HBM on every inner step
 *   (stage 6 removes that traffic).
 * Measured on H200: see notes/05_delayed_rescaling.md.
 * Run: ./stage5 --seqlen 4096 --dim 64 --causal --counters
 */
#include "common/attn.h"
#include "common/cuda/counters.cuh"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* One configuration (tiles below): K/V tiles of Bc keys, Q tiles of Br rows per inner step. With
 * sliced K each warp owns KEYS_PER_WARP keys of K_j and V_j, which must be one k16 step of the
 * P_ij V_j product: 16 keys, so a block has Bc / 16 warps (four at Bc = 64). Sliced K makes every
 * warp produce a partial O for all Br rows (its keys touch every row): Br x HeadDim fp32 per warp,
 * Br * HeadDim / 32 registers per thread (128 at HeadDim = 128, Br = 32; each of its tiles is a
 * single mma, so the compiler can store them to shared memory as they finish), and the warps'
 * partials meet in shared memory: 68 KiB at HeadDim = 128, 112 KiB in all with K_j, V_j, Q_i.
 * Br = 64 would double the partials to 190 KiB in all, past the A100's 163 KiB opt-in limit;
 * smaller Br would load K_j, V_j fragments for fewer rows each time. */

/* Shared-memory row padding against bank conflicts.
 * fp16 tiles: a row of HeadDim halves is a multiple of 128 bytes, so the 8 rows one ldmatrix reads
 *   would all start in the same bank. +8 halves (16 bytes) moves each row 4 banks on: the 8 rows
 *   cover all 32 banks, and rows stay 16-byte aligned for cp.async and ldmatrix.
 * fp32 partial O: a warp writes float2 at rows g (0..7) and columns 2t (0..6); with a stride of
 *   HeadDim floats (a multiple of 32) the rows collide. +8 floats puts row g at bank 8g: a half-warp's
 *   sixteen 8-byte stores hit 32 distinct banks, and rows stay 16-byte aligned for float4. */
constexpr int HALF_PAD = 8;
constexpr int FLOAT_PAD = 8;

/* One configuration, and its dynamic shared memory computed from the tile sizes (byte offsets,
 * then the total). */
template <int HeadDim_, int Br_, int Bc_>
struct tiles {
    static constexpr int HeadDim = HeadDim_, Br = Br_, Bc = Bc_;
    static constexpr int KEYS_PER_WARP = 16;              /* one k16 step of mma */
    static constexpr int NWARPS = Bc / KEYS_PER_WARP;
    static constexpr int NTHREADS = NWARPS * WARP_SIZE;
    static constexpr int M_TILES = Br / 16;               /* m16 row tiles of the mma */
    static constexpr int LDH = HeadDim + HALF_PAD;   /* row stride of K_j, V_j, Q_i (halves) */
    static constexpr int LDF = HeadDim + FLOAT_PAD;  /* row stride of the partial O (floats) */
    static constexpr size_t K_j = 0;                                               /* [Bc][LDH] fp16 */
    static constexpr size_t V_j = K_j + sizeof(__half) * Bc * LDH;                 /* [Bc][LDH] fp16 */
    static constexpr size_t Q_i = V_j + sizeof(__half) * Bc * LDH;                 /* [Br][LDH] fp16 */
    static constexpr size_t O_part = Q_i + sizeof(__half) * Br * LDH;              /* [NWARPS][Br][LDF] */
    static constexpr size_t row_max = O_part + sizeof(float) * NWARPS * Br * LDF;  /* [NWARPS][Br] */
    static constexpr size_t row_sum = row_max + sizeof(float) * NWARPS * Br;       /* [NWARPS][Br] */
    static constexpr size_t alpha = row_sum + sizeof(float) * NWARPS * Br;         /* [Br] */
    static constexpr size_t beta = alpha + sizeof(float) * Br;                     /* [Br] */
    static constexpr size_t inv_l = beta + sizeof(float) * Br;                     /* [Br] */
    static constexpr size_t smem_bytes = inv_l + sizeof(float) * Br;
    static_assert(KEYS_PER_WARP * NWARPS == Bc, "the warps' key slices must cover K_j exactly");
    static_assert(Br % 16 == 0, "Br must be whole m16 tiles");
    static_assert(Bc % Br == 0, "causal skip (i starts at j*Bc/Br) assumes Br divides Bc");
    static_assert(Br <= NTHREADS, "one thread per row computes the row factors");
    static_assert(HeadDim % 16 == 0, "head dim must be whole k16 steps");
    static_assert(O_part % 16 == 0, "partial O must be 16-byte aligned for float4");
};

/* Per head dim, fastest first (launch takes the first that fits the device's shared memory,
 * common/cuda/launch.cuh). d = 64 fits every GPU. At d = 128 the first needs 112 KiB: a GPU that
 * allows 99 KiB per block (RTX 30, 40, 50 cards) halves Br, one that allows 64 KiB (Turing)
 * halves Bc instead: two warps of 16 keys each. */
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { typedef config_list<tiles<64, 32, 64>> list; };    /* 60 KiB */
template <>
struct cfg<128> { typedef config_list<tiles<128, 32, 64>,           /* 112 KiB */
                                      tiles<128, 16, 64>,           /* 73 KiB */
                                      tiles<128, 32, 32>> list; };  /* 60 KiB */

/* Calls f(Tiles{}) with the first configuration of head dim d that fits `limit` bytes. */
template <class F>
int with_tiles(int d, size_t limit, char *why, size_t n, F &&f)
{
    switch (d) {
    case 64: return first_fit(cfg<64>::list(), limit, d, why, n, f);
    case 128: return first_fit(cfg<128>::list(), limit, d, why, n, f);
    }
    snprintf(why, n, "supports head dim 64 or 128 (got d=%d)", d);
    return ATTN_UNSUPPORTED;
}

/* ---- kernel ---- */

/* Rows row0 .. row0+ROWS-1 of one head's [N, HeadDim] fp16 matrix into a shared tile with row stride
 * LDH, 16 bytes per cp.async. Rows at or past N are zero-filled (and never read from HBM). */
template <class Tiles, int ROWS>
__device__ __forceinline__ void load_tile(__half *tile, const __half *src, int row0, int N)
{
    constexpr int HeadDim = Tiles::HeadDim, LDH = Tiles::LDH;
    constexpr int CHUNKS = HeadDim / 8; /* 16-byte pieces per row */
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += Tiles::NTHREADS) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool valid = row0 + r < N;
        const __half *from = src + (size_t)(valid ? row0 + r : 0) * HeadDim + col;
        cp_async_16_zfill(tile + r * LDH + col, from, valid);
    }
}

/* COUNT: the counting build for --counters (common/cuda/counters.cuh); the timed build has none. */
template <class Tiles, bool COUNT>
__global__ void __launch_bounds__(Tiles::NTHREADS)
stage5_delayed_kernel(const __half *__restrict__ Q, const __half *__restrict__ K, const __half *__restrict__ V,
                      __half *__restrict__ O, float *__restrict__ L, float *__restrict__ work, int N, int causal,
                      float scale_log2, unsigned long long *counters)
{
    typedef Tiles SM;
    constexpr int HeadDim = SM::HeadDim, Br = SM::Br, Bc = SM::Bc, NWARPS = SM::NWARPS, NTHREADS = SM::NTHREADS;
    constexpr int KEYS_PER_WARP = SM::KEYS_PER_WARP, M_TILES = SM::M_TILES, LDH = SM::LDH, LDF = SM::LDF;
    /* The combine gives each thread COMBINE_PER_THREAD float4 pieces of the Br x HeadDim tile O_i. */
    constexpr int COMBINE_PER_THREAD = Br * (HeadDim / 4) / NTHREADS;
    static_assert(Br * (HeadDim / 4) % NTHREADS == 0, "O_i must split evenly into float4 pieces per thread");
    extern __shared__ __align__(16) unsigned char smem[];
    __half *K_j = (__half *)(smem + SM::K_j);
    __half *V_j = (__half *)(smem + SM::V_j);
    __half *Q_i = (__half *)(smem + SM::Q_i);
    float *O_part = (float *)(smem + SM::O_part);   /* each warp's P~_ij V_j slice product */
    float *row_max = (float *)(smem + SM::row_max); /* each warp's rowmax over its keys */
    float *row_sum = (float *)(smem + SM::row_sum); /* each warp's rowsum over its keys */
    float *alpha = (float *)(smem + SM::alpha);     /* e^(m_i - m_new): the correction of O_i */
    float *beta = (float *)(smem + SM::beta);       /* e^(m~_ij - m_new): brings P~_ij V_j to m_new */
    float *inv_l = (float *)(smem + SM::inv_l);     /* 1 / l_new, used on a row's last step only */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;          /* groupID, tid_in_group (see mma.cuh) */
    const int key0 = warp * KEYS_PER_WARP;          /* this warp's slice of K_j, V_j */

    /* One block per (batch, head): move every pointer to this head. The workspace holds
     * O_acc[B,H,N,HeadDim] (fp32), then m[B,H,N] (log2 domain), then l[B,H,N]. */
    const size_t bh = blockIdx.x, BH = gridDim.x, head = bh * N * HeadDim;
    Q += head, K += head, V += head, O += head, L += bh * N;
    float *O_hbm = work + head;
    float *m_hbm = work + BH * N * HeadDim + bh * N;
    float *l_hbm = work + BH * N * HeadDim + BH * N + bh * N;

    const int Tr = CEIL_DIV(N, Br), Tc = CEIL_DIV(N, Bc);
    work_tally<COUNT> tally;

    for (int j = 0; j < Tc; j++) {
        const int i_start = causal ? (j * Bc) / Br : 0; /* causal: Q tiles wholly above the diagonal see none of K_j */
        /* K_j, V_j: HBM -> shared memory once per outer step, read by every inner step; and the
         * first Q_i of this outer step (the later ones are fetched one step ahead, below). */
        load_tile<Tiles, Bc>(K_j, K, j * Bc, N);
        load_tile<Tiles, Bc>(V_j, V, j * Bc, N);
        load_tile<Tiles, Br>(Q_i, Q, i_start * Br, N);
        cp_async_commit();

        for (int i = i_start; i < Tr; i++) {
            const int j_last = causal ? min(Tc - 1, ((i + 1) * Br - 1) / Bc) : Tc - 1;
            const bool first = (j == 0), last = (j == j_last);

            /* O_i, m_i, l_i: HBM -> registers at the top of the step, so that their latency hides
             * behind the matrix products (the combine at the bottom is their first use). On the
             * first visit they start as O_i = 0, m_i = -inf, l_i = 0 and the workspace is not
             * read (so it needs no initialization). O_i round-trips HBM every step, unnormalized
             * now: this read and the write in the combine are the traffic stage 6 removes. */
            float4 O_old[COMBINE_PER_THREAD];
#pragma unroll
            for (int k = 0; k < COMBINE_PER_THREAD; k++) {
                const int c = tid + k * NTHREADS, r = c / (HeadDim / 4), col = (c % (HeadDim / 4)) * 4, query = i * Br + r;
                O_old[k] = make_float4(0.f, 0.f, 0.f, 0.f);
                if (!first && query < N) O_old[k] = *(const float4 *)&O_hbm[(size_t)query * HeadDim + col];
            }
            float m_i = -INFINITY, l_i = 0.f; /* one thread per row */
            if (tid < Br && !first && i * Br + tid < N) {
                m_i = m_hbm[i * Br + tid];
                l_i = l_hbm[i * Br + tid];
            }
            cp_async_wait<0>();
            __syncthreads(); /* Q_i (and K_j, V_j on the first inner step) in shared memory */

            /* S_ij = scale * Q_i K_j^T, this warp's 16 keys for all Br rows. */
            float S_ij[M_TILES][2][4] = {}; /* [m16 row tile][n8 key tile][C fragment] */
#pragma unroll
            for (int k = 0; k < HeadDim; k += 16) {
                uint32_t Kf[4]; /* B fragments: Kf[0..1] keys 0-7, Kf[2..3] keys 8-15 */
                ldmatrix_x4(Kf, K_j + (key0 + (lane & 7) + ((lane >> 4) << 3)) * LDH + k + (((lane >> 3) & 1) << 3));
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++) {
                    uint32_t Qf[4]; /* A fragment: rows mt*16 .. +15, columns k .. k+15 */
                    ldmatrix_x4(Qf, Q_i + (mt * 16 + (lane & 15)) * LDH + k + ((lane >> 4) << 3));
                    mma_m16n8k16_f16(S_ij[mt][0], Qf, &Kf[0]);
                    mma_m16n8k16_f16(S_ij[mt][1], Qf, &Kf[2]);
                }
            }

            /* Scale into the log2 domain and mask, then this warp's part of m~_ij = rowmax(S_ij).
             * C fragment: S_ij[mt][nt][2h + e] is row mt*16 + 8h + g, key nt*8 + 2t + e. */
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = mt * 16 + 8 * h + g, query = i * Br + r;
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int key = j * Bc + key0 + nt * 8 + 2 * t + e;
                            float s = S_ij[mt][nt][2 * h + e] * scale_log2;
                            if (key >= N || (causal && key > query)) s = -INFINITY; /* tail, causal mask */
                            S_ij[mt][nt][2 * h + e] = s;
                            mx = fmaxf(mx, s);
                        }
                    /* the four lanes of a quad hold the same row: reduce across them */
                    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
                    if (t == 0) row_max[warp * Br + r] = mx;
                }
            __syncthreads(); /* every warp's partial row max in shared memory before any reads them;
                              * past this barrier no warp reads Q_i again */

            /* Q_{i+1}: HBM -> shared memory now, overlapping the rest of this step (Algorithm 1
             * still loads Q_i once per inner step; it only starts the load earlier). */
            if (i + 1 < Tr) load_tile<Tiles, Br>(Q_i, Q, (i + 1) * Br, N);
            cp_async_commit();

            /* m~_ij = max over the warps; P~_ij = exp(S_ij - m~_ij); l~_ij = rowsum(P~_ij),
             * this warp's part of the sum. A row masked in the whole tile has m~_ij = -inf:
             * subtract 0 instead, so P~_ij = exp2(-inf) = 0, not exp2(-inf + inf) = NaN. */
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = mt * 16 + 8 * h + g;
                    float m_tilde = -INFINITY;
#pragma unroll
                    for (int w = 0; w < NWARPS; w++) m_tilde = fmaxf(m_tilde, row_max[w * Br + r]);
                    const float base = m_tilde == -INFINITY ? 0.f : m_tilde;
                    float sum = 0.f;
#pragma unroll
                    for (int nt = 0; nt < 2; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float p = exp2_approx(S_ij[mt][nt][2 * h + e] - base);
                            S_ij[mt][nt][2 * h + e] = p;
                            sum += p;
                        }
                    sum += __shfl_xor_sync(FULL_MASK, sum, 1);
                    sum += __shfl_xor_sync(FULL_MASK, sum, 2);
                    if (t == 0) row_sum[warp * Br + r] = sum;
                }

            /* P~_ij as fp16 A fragments: the C layout of the two n8 key tiles is the A layout of
             * one k16 tile (mma.cuh), so P~ never leaves registers. */
            uint32_t P_ij[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++) {
                P_ij[mt][0] = pack_half2(S_ij[mt][0][0], S_ij[mt][0][1]); /* row g,   keys 2t..   */
                P_ij[mt][1] = pack_half2(S_ij[mt][0][2], S_ij[mt][0][3]); /* row g+8, keys 2t..   */
                P_ij[mt][2] = pack_half2(S_ij[mt][1][0], S_ij[mt][1][1]); /* row g,   keys 8+2t.. */
                P_ij[mt][3] = pack_half2(S_ij[mt][1][2], S_ij[mt][1][3]); /* row g+8, keys 8+2t.. */
            }

            /* This warp's partial P~_ij V_j = P~_ij[:, slice] V_j[slice, :], Br x HeadDim in fp32. */
            float O_w[M_TILES][HeadDim / 8][4] = {}; /* [m16 row tile][n8 column tile][C fragment] */
#pragma unroll
            for (int n = 0; n < HeadDim; n += 16) {
                uint32_t Vf[4]; /* B fragments: Vf[0..1] columns n..n+7, Vf[2..3] columns n+8.. */
                ldmatrix_x4_trans(Vf, V_j + (key0 + (lane & 15)) * LDH + n + ((lane >> 4) << 3));
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++) {
                    mma_m16n8k16_f16(O_w[mt][n / 8], P_ij[mt], &Vf[0]);
                    mma_m16n8k16_f16(O_w[mt][n / 8 + 1], P_ij[mt], &Vf[2]);
                }
            }
            float *O_mine = O_part + warp * Br * LDF;
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int nt = 0; nt < HeadDim / 8; nt++) {
                    const int r = mt * 16 + g, c = nt * 8 + 2 * t;
                    *(float2 *)&O_mine[r * LDF + c] = make_float2(O_w[mt][nt][0], O_w[mt][nt][1]);
                    *(float2 *)&O_mine[(r + 8) * LDF + c] = make_float2(O_w[mt][nt][2], O_w[mt][nt][3]);
                }
            __syncthreads(); /* all partial sums and partial O in shared memory before the combine */

            /* Row factors, one thread per row r:
             *   m_new = max(m_i, m~_ij)
             *   l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij
             *   alpha = e^(m_i - m_new),   beta = e^(m~_ij - m_new)     no division by l_new:
             *   inv_l = 1 / l_new, only on the row's last step            that waits for the end
             * (exponentials are exp2: m is kept in the log2 domain). */
            if (tid < Br) {
                const int r = tid, query = i * Br + r;
                float m_tilde = -INFINITY, l_tilde = 0.f;
#pragma unroll
                for (int w = 0; w < NWARPS; w++) {
                    m_tilde = fmaxf(m_tilde, row_max[w * Br + r]);
                    l_tilde += row_sum[w * Br + r];
                }
                const float m_new = fmaxf(m_i, m_tilde);
                const float base = m_new == -INFINITY ? 0.f : m_new; /* all masked so far: no NaN */
                const float e_i = exp2_approx(m_i - base), e_tilde = exp2_approx(m_tilde - base);
                const float l_new = e_i * l_i + e_tilde * l_tilde;
                alpha[r] = e_i;
                beta[r] = e_tilde;
                if (last) inv_l[r] = l_new > 0.f ? 1.f / l_new : 0.f; /* an all-masked row gives O = 0 */
                if (query < N) {
                    if (last) /* L = m + log(l) in nats: the logsumexp the backward needs */
                        L[query] = m_new * LN2 + logf(l_new);
                    else { /* m_i, l_i round-trip HBM here: stage 6 keeps them in registers */
                        m_hbm[query] = m_new;
                        l_hbm[query] = l_new;
                    }
                }
            }
            __syncthreads(); /* alpha, beta, inv_l in shared memory before the combine reads them */

            /* O_i <- diag(e^(m_i - m_new)) O_i + e^(m~_ij - m_new) P~_ij V_j     (unnormalized)
             *      = alpha * O_i + beta * sum over warps of the partial P~_ij V_j,
             * and on the row's last step only, O_i <- diag(l_new)^-1 O_i.
             * Four consecutive columns per thread, consecutive threads along a row: coalesced. */
#pragma unroll
            for (int k = 0; k < COMBINE_PER_THREAD; k++) {
                const int c = tid + k * NTHREADS, r = c / (HeadDim / 4), col = (c % (HeadDim / 4)) * 4, query = i * Br + r;
                if (query >= N) continue; /* rows past N are never read or written */
                if (col == 0) tally.add(CNT_ROW_CORRECT); /* each O row, every step */
                float4 PV = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int w = 0; w < NWARPS; w++) {
                    const float4 p = *(const float4 *)&O_part[(w * Br + r) * LDF + col];
                    PV.x += p.x, PV.y += p.y, PV.z += p.z, PV.w += p.w;
                }
                const float a = alpha[r], b = beta[r];
                float4 O_new = make_float4(a * O_old[k].x + b * PV.x, a * O_old[k].y + b * PV.y,
                                           a * O_old[k].z + b * PV.z, a * O_old[k].w + b * PV.w);
                if (last) { /* the one normalization; the final O_i, in fp16, to the output */
                    const float il = inv_l[r];
                    if (col == 0) tally.add(CNT_ROW_NORMALIZE);
                    O_new = make_float4(O_new.x * il, O_new.y * il, O_new.z * il, O_new.w * il);
                    *(uint2 *)&O[(size_t)query * HeadDim + col] =
                        make_uint2(pack_half2(O_new.x, O_new.y), pack_half2(O_new.z, O_new.w));
                } else /* unnormalized O_i back to the fp32 workspace for the next K/V tile */
                    *(float4 *)&O_hbm[(size_t)query * HeadDim + col] = O_new;
            }
            /* No barrier here: the next step writes no shared memory before its first barrier
             * (its Q_i is already on the way); O_part, row_max, row_sum, alpha, beta and inv_l
             * are rewritten only after that barrier. */
        }
        __syncthreads(); /* every warp is done with K_j, V_j before the next tile overwrites them */
    }
    tally.flush(counters);
}

/* ---- launcher ---- */

size_t workspace_bytes(const struct attn_args *a)
{
    const struct shape *sh = &a->sh;
    /* O_acc[B,H,N,d], then m[B,H,N], then l[B,H,N], all fp32 */
    return (size_t)sh->B * sh->H * sh->N * (sh->d + 2) * sizeof(float);
}

/* The HBM bytes the loop structure moves, walking the (j, i) steps the kernel takes (rows past N
 * are zero-filled, never read): K_j, V_j once; Q_i on every step; O_i, m_i, l_i read on every
 * step but a row's first and written on every step but its last; O (fp16) and L once. */
template <class Tiles>
void hbm_bytes_with(const struct shape *sh, struct hbm_traffic *t)
{
    constexpr int Br = Tiles::Br, Bc = Tiles::Bc;
    const int N = sh->N, Tr = CEIL_DIV(N, Br), Tc = CEIL_DIV(N, Bc);
    double q_rows = 0, work_rows = 0; /* per head: Q rows read, O_i/m_i/l_i rows read or written */
    for (int j = 0; j < Tc; j++)
        for (int i = sh->causal ? (j * Bc) / Br : 0; i < Tr; i++) {
            const int rows = min(Br, N - i * Br);
            const int j_last = sh->causal ? min(Tc - 1, ((i + 1) * Br - 1) / Bc) : Tc - 1;
            q_rows += rows;
            work_rows += (j > 0 ? rows : 0) + (j < j_last ? rows : 0);
        }
    const double heads = (double)sh->B * sh->H, d = sh->d;
    t->Q = heads * q_rows * d * sizeof(__half);
    t->KV = heads * 2.0 * N * d * sizeof(__half);
    t->O = heads * N * d * sizeof(__half);
    t->O_work = heads * work_rows * d * sizeof(float);
    t->rowstats = heads * (work_rows * 2 + N) * sizeof(float); /* m_i and l_i; then L */
    t->q_reads = q_rows / N;
}

/* ... with the tiles this device takes */
void hbm_bytes(const struct shape *sh, struct hbm_traffic *t)
{
    char why[160];
    with_tiles(sh->d, gpu_smem_limit(), why, sizeof why, [&](auto tl) {
        hbm_bytes_with<decltype(tl)>(sh, t);
        return 0;
    });
}

template <class Tiles, bool COUNT>
int launch(const struct attn_args *a, char *why, size_t n)
{
    const size_t smem = Tiles::smem_bytes;
    if (int rc = smem_optin(stage5_delayed_kernel<Tiles, COUNT>, smem, Tiles::HeadDim, why, n)) return rc;

    const struct shape *sh = &a->sh;
    const dim3 grid(sh->B * sh->H); /* one block per (batch, head), as in Algorithm 1 */
    const dim3 block(Tiles::NTHREADS);
    stage5_delayed_kernel<Tiles, COUNT><<<grid, block, smem>>>((const __half *)a->Q, (const __half *)a->K,
                                                         (const __half *)a->V, (__half *)a->O, a->L,
                                                         (float *)a->work, sh->N, sh->causal, sh->scale * LOG2E,
                                                         a->counters);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

int forward(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype != DT_F16 || (a->sh.d != 64 && a->sh.d != 128)) {
        snprintf(why, n, "supports fp16 with head dim 64 or 128 (got %s, d=%d)",
                 dtype_name(a->dtype), a->sh.d);
        return ATTN_UNSUPPORTED;
    }
    if (a->work == NULL) {
        snprintf(why, n, "needs its workspace (O, m, l in HBM) and got none");
        return ATTN_UNSUPPORTED;
    }
    /* the tiles: the first of the head dim's configurations that fits this device */
    return with_tiles(a->sh.d, gpu_smem_limit(), why, n, [&](auto tl) {
        return a->counters ? launch<decltype(tl), true>(a, why, n) : launch<decltype(tl), false>(a, why, n);
    });
}

/* The tiles forward takes where a block may have `limit` bytes (the summary names them). */
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    (void)backward; /* a forward only */
    return with_tiles(a->sh.d, limit, c->text, sizeof c->text, [&](auto tl) {
        typedef decltype(tl) Tl;
        return tiles_found(c, Tl::Br, Tl::Bc, Tl::smem_bytes, "Br=%d Bc=%d, %d warps", Tl::Br, Tl::Bc, Tl::NWARPS);
    });
}

} // namespace

extern "C" const struct stage stage5_desc = {
    .name = "stage5",
    .idea = "delayed rescaling: O kept unnormalized, corrected by exp(m_old - m_new), divided by l once",
    .device = ON_GPU,
    .forward = forward,
    .backward = NULL,
    .dims = {64, 128},
    .dtypes = DT_F16,
    .workspace_bytes = workspace_bytes,
    .openmp = 0,
    .hbm_traffic = hbm_bytes,
    .measures_backward = 0,
    .arch_sm = 0,
    .tiles = tiles_for,
};
