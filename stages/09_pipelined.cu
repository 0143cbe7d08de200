/* 09_pipelined.cu: FlashAttention-2 forward, engineered to FlashAttention-2's speed
 *
 * Changed from stage 8: the algorithm and the grid stay (one block per Q tile, heaviest first,
 *   causal tiles skipped); the kernel is engineered, one piece at a time:
 *   - double-buffered cp.async: K_{j+1} and V_{j+1} are copied into a second buffer while tile j
 *     computes: one barrier per K/V step instead of two, and every load has a whole step to
 *     arrive (stage 8: half a step);
 *   - swizzled, unpadded shared memory read with ldmatrix: 16-byte chunks XOR-permuted by row
 *     (common/cuda/swizzle.cuh), so cp.async writes and ldmatrix reads are free of bank conflicts
 *     without padding; a lane computes its ldmatrix address once per operand, and every other
 *     fragment's address is a compile-time step from it;
 *   - raw scores, with scale * log2(e) folded into one constant: exp(scale * s - scale * m) is
 *     one FFMA and one exp2 per score (stage 8 multiplies every score first); row sums stay per
 *     thread until the end;
 *   - tile sizes per head dim (configuration below): four warps, each owning 32 rows where
 *     registers allow (so every K and V fragment it loads feeds two mma), and Bc and the
 *     softmax's sub-tile Bs chosen per d;
 *   - masks only on the tiles that need them: the tail of N and, when causal, the tiles that
 *     cross the diagonal (stage 8 tests every score);
 *   - O leaves through shared memory (each warp's own rows of the Q tile) in 16-byte stores;
 *   - fp16 and bf16: one kernel, the element type a template parameter;
 *   - d = 32, 64, 128, 256 (stage 8: 64 and 128).
 * Why: with the sequence parallel grid every SM is busy; what is left is the time an SM spends
 *   per tile: shared-memory reads, waits for loads, and the instructions around the mma. Each
 *   piece removes some of it.
 * Measured on H200: notes/09_pipelined.md, with the ablation (each piece taken out in turn).
 * Run: ./stage9 --batch 1 --heads 1 --seqlen 16384 --dim 128 --causal
 */
#include "common/attn.h"
#include "common/cuda/counters.cuh"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/swizzle.cuh"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* Four warps per block at every head dim (eight warps of 16 rows measured 9 to 20% slower than
 * four of 32: notes/09_pipelined.md). A configuration (tiles below): each warp owns M_TILES m16
 * tiles (16 * M_TILES rows) of the Q tile; K/V tiles of Bc keys; and the softmax and P_ij V_j
 * work through a K/V tile in sub-tiles of Bs keys (Bs = Bc where registers allow). Per thread a
 * warp's rows hold M_TILES * HeadDim / 2 fp32 of O_i and M_TILES * Bs / 2 of S_ij; the sum must
 * stay well under the 255 registers a thread may use, or the kernel spills (check with -Xptxas
 * -v). Two row tiles per warp (M_TILES = 2) halve the shared-memory reads per mma: each K or V
 * fragment serves both. */
constexpr int NWARPS = 4;

/* One configuration and everything derived from it: tile sizes and the shared-memory layout. */
template <int HeadDim_, int M_TILES_, int Bc_, int Bs_>
struct tiles {
    static constexpr int HeadDim = HeadDim_, M_TILES = M_TILES_, Bc = Bc_, Bs = Bs_;
    static constexpr int NTHREADS = NWARPS * WARP_SIZE;
    static constexpr int ROWS_PER_WARP = 16 * M_TILES;
    static constexpr int Br = NWARPS * ROWS_PER_WARP;
    /* Q_i [Br][HeadDim], then two buffers of K_j [Bc][HeadDim] and V_j [Bc][HeadDim], all 16-bit, swizzled */
    static constexpr size_t Q_i = 0;
    static constexpr size_t K_j = Q_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t V_j = K_j + 2 * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t smem_bytes = V_j + 2 * 2 * (size_t)Bc * HeadDim;
    static_assert(HeadDim % 16 == 0 && HeadDim >= 32, "head dim must be whole k16 steps, and at least 32 (swizzle)");
    static_assert(Bs % 16 == 0 && Bc % Bs == 0, "sub-tiles must be whole k16 steps of P_ij V_j and divide Bc");
};

/* Per head dim, fastest first (launch takes the first that fits the device's shared memory,
 * common/cuda/launch.cuh). The first is what an H100, H200 or A100 (163 KiB) runs. Where a GPU
 * allows less, Bc shrinks, which keeps the rows per warp and the O_i registers: 99 KiB (RTX 30,
 * 40, 50 cards) changes only d = 256's tiles; 64 KiB (Turing) d = 64's and 128's too. Shared
 * memory of each in the comment; O + S registers per thread. */
template <int HeadDim>
struct cfg;
template <>
struct cfg<32> { typedef config_list<tiles<32, 2, 128, 128>> list; };   /* 40 KiB; O 32 + S 128 */
template <>
struct cfg<64> { typedef config_list<tiles<64, 2, 128, 128>,            /* 80 KiB; O 64 + S 128 */
                                     tiles<64, 2, 64, 64>> list; };     /* 48 KiB; O 64 + S 64 */
template <>
struct cfg<128> { typedef config_list<tiles<128, 2, 64, 32>,            /* 96 KiB; O 128 + S 32 */
                                      tiles<128, 2, 32, 32>> list; };   /* 64 KiB; O 128 + S 32 */
template <>
struct cfg<256> { typedef config_list<tiles<256, 1, 64, 64>,            /* 160 KiB; O 128 + S 32 */
                                      tiles<256, 1, 32, 32>,            /* 96 KiB; O 128 + S 16 */
                                      tiles<256, 1, 16, 16>> list; };   /* 64 KiB; O 128 + S 8 */

/* Calls f(Tiles{}) with the first configuration of head dim d that fits `limit` bytes. */
template <class F>
int with_tiles(int d, size_t limit, char *why, size_t n, F &&f)
{
    switch (d) {
    case 32: return first_fit(cfg<32>::list(), limit, d, why, n, f);
    case 64: return first_fit(cfg<64>::list(), limit, d, why, n, f);
    case 128: return first_fit(cfg<128>::list(), limit, d, why, n, f);
    case 256: return first_fit(cfg<256>::list(), limit, d, why, n, f);
    }
    snprintf(why, n, "supports head dim 32, 64, 128 or 256 (got d=%d)", d);
    return ATTN_UNSUPPORTED;
}

/* ---- kernel ---- */

/* COUNT: the counting build for --counters (common/cuda/counters.cuh); the timed build has none. */
template <typename T, class Tiles, bool COUNT>
__global__ void __launch_bounds__(Tiles::NTHREADS)
stage9_pipelined_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                           T *__restrict__ O, float *__restrict__ L, int N, int causal, float scale_log2,
                           unsigned long long *counters)
{
    constexpr int HeadDim = Tiles::HeadDim;
    typedef mma16<T> M;
    constexpr int NTHREADS = Tiles::NTHREADS, M_TILES = Tiles::M_TILES, Br = Tiles::Br, Bc = Tiles::Bc;
    constexpr int Bs = Tiles::Bs;
    constexpr int KT = Bs / 8;      /* key tiles: n8 tiles of S_ij in a sub-tile of Bs keys */
    constexpr int DT = HeadDim / 8; /* dim tiles: n8 column tiles of O_i */
    extern __shared__ __align__(128) unsigned char smem[];
    T *Q_i = (T *)(smem + Tiles::Q_i);
    T *K_buf = (T *)(smem + Tiles::K_j); /* [2][Bc][HeadDim] */
    T *V_buf = (T *)(smem + Tiles::V_j); /* [2][Bc][HeadDim] */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;      /* groupID, tid_in_group (see mma.cuh) */
    const int row0 = warp * Tiles::ROWS_PER_WARP;  /* this warp's rows of Q_i, O_i */
    /* this lane's ldmatrix addresses at the first fragment of each operand, the rest are
     * swizzle_steps from them (common/cuda/swizzle.cuh): Q as A fragments, K (stored as B^T) and
     * V (stored k-major, read .trans) as B fragments */
    const unsigned Q_lane = swizzle_addr<HeadDim>((unsigned)__cvta_generic_to_shared(Q_i), row0 + a_order_row(lane),
                                                  a_order_chunk(lane));
    const unsigned K_lane = swizzle_addr<HeadDim>((unsigned)__cvta_generic_to_shared(K_buf), b_order_row(lane),
                                                  b_order_chunk(lane));
    const unsigned V_lane = swizzle_addr<HeadDim>((unsigned)__cvta_generic_to_shared(V_buf), a_order_row(lane),
                                                  a_order_chunk(lane));
    constexpr unsigned TILE_BYTES = 2 * Bc * HeadDim; /* one K (or V) buffer */

    /* The grid: x = (batch, head), y = Q tile. Blocks start in linear order (x fastest), so with a
     * causal mask y = 0 takes the last Q tile, which sees the most K/V tiles: the longest blocks
     * start first and the short ones fill in at the end. */
    const int Tr = gridDim.y;
    const int i = causal ? Tr - 1 - (int)blockIdx.y : (int)blockIdx.y;
    const size_t bh = blockIdx.x, head = bh * N * HeadDim;
    Q += head, K += head, V += head, O += head, L += bh * N;
    const int q0 = i * Br; /* first query row of this tile */
    /* K/V tiles this Q tile sees: all of them, or (causal) up to the one holding its last row */
    const int Tc = CEIL_DIV(N, Bc);
    const int n_tiles = causal ? min(Tc, (min(q0 + Br, N) - 1) / Bc + 1) : Tc;
    work_tally<COUNT> tally;

    /* Q_i, K_0 and V_0: one cp.async group. */
    load_tile_swizzled<T, HeadDim, Br, NTHREADS>(Q_i, Q, q0, N);
    load_tile_swizzled<T, HeadDim, Bc, NTHREADS>(K_buf, K, 0, N);
    load_tile_swizzled<T, HeadDim, Bc, NTHREADS>(V_buf, V, 0, N);
    cp_async_commit();

    /* This lane's rows are row0 + 16 mt + 8 h + g (mt < M_TILES, h = 0, 1). m_i is the running
     * max of the raw scores (not yet scaled); l_i is this lane's part of the row sum (its 2 of
     * every 8 columns), added across the quad only at the end. */
    float O_acc[M_TILES][DT][4] = {};
    float m_i[M_TILES][2], l_i[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) m_i[mt][0] = m_i[mt][1] = -INFINITY, l_i[mt][0] = l_i[mt][1] = 0.f;

    for (int j = 0; j < n_tiles; j++) {
        cp_async_wait<0>();
        __syncthreads(); /* K_j, V_j (and Q_i) in shared memory; every warp is done with tile j-1,
                          * so its buffer is free for tile j+1 */
        if (j + 1 < n_tiles) { /* tile j+1 copies while tile j computes */
            const int b = (j + 1) & 1;
            load_tile_swizzled<T, HeadDim, Bc, NTHREADS>(K_buf + b * Bc * HeadDim, K, (j + 1) * Bc, N);
            load_tile_swizzled<T, HeadDim, Bc, NTHREADS>(V_buf + b * Bc * HeadDim, V, (j + 1) * Bc, N);
        }
        cp_async_commit();
        const unsigned K_j = K_lane + (j & 1) * TILE_BYTES, V_j = V_lane + (j & 1) * TILE_BYTES;

        /* The tile in sub-tiles of Bs keys (Bs = Bc where registers allow): scores, softmax and
         * P_ij V_j for each in turn, so only Bs / 2 scores per row tile are live at once. Not
         * unrolled: unrolled, the compiler overlaps two sub-tiles and runs out of registers. */
#pragma unroll 1
        for (int sb = 0; sb < Bc; sb += Bs) {
            const int key0 = j * Bc + sb; /* first key of this sub-tile */
            /* S_ij = Q_i K_j^T (raw: the scale is applied inside the exponential), this warp's rows */
            float S_ij[M_TILES][KT][4] = {};
    #pragma unroll
            for (int k = 0; k < HeadDim; k += 16) {
                uint32_t Qf[M_TILES][4]; /* A fragments: rows 16 mt .. +15, columns k .. k+15 */
    #pragma unroll
                for (int mt = 0; mt < M_TILES; mt++)
                    ldmatrix_x4_at(Qf[mt], swizzle_step<HeadDim>(Q_lane, mt * 16, k / 8));
    #pragma unroll
                for (int kb = 0; kb < Bs / 16; kb++) {
                    uint32_t Kf[4]; /* B fragments: Kf[0..1] keys 16kb .. +7, Kf[2..3] keys 16kb+8 .. +15 */
                    ldmatrix_x4_at(Kf, swizzle_step<HeadDim>(K_j, sb + kb * 16, k / 8));
    #pragma unroll
                    for (int mt = 0; mt < M_TILES; mt++) {
                        M::mma(S_ij[mt][2 * kb], Qf[mt], &Kf[0]);
                        M::mma(S_ij[mt][2 * kb + 1], Qf[mt], &Kf[2]);
                    }
                }
            }

            /* Masks, only on the tiles that need them: the tail tile (keys past N) and, when causal,
             * the tiles that cross the diagonal (some key after some query of this tile). */
            if (key0 + Bs > N || (causal && key0 + Bs - 1 > q0)) {
    #pragma unroll
                for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
                    for (int nt = 0; nt < KT; nt++)
    #pragma unroll
                        for (int c = 0; c < 4; c++) {
                            const int key = key0 + nt * 8 + 2 * t + (c & 1);
                            const int query = q0 + row0 + mt * 16 + 8 * (c >> 1) + g;
                            if (key >= N || (causal && key > query)) S_ij[mt][nt][c] = -INFINITY;
                        }
            }

            /* The online softmax per row, in registers (stage 8's, with the scale folded in):
             *   m_new = max(m_i, rowmax(S_ij));  base = scale * m_new * log2(e)
             *   P_ij  = exp2(scale_log2 * S_ij - base)          one FFMA and one MUFU per score
             *   alpha = exp2(scale_log2 * m_i - base);  l_i = alpha l_i + rowsum(P_ij);  O_i *= alpha
             * A row masked so far has m_new = -inf: base = 0, so P_ij = exp2(-inf) = 0, not NaN.
             * The two products scale_log2 * m are each rounded once, alike (__fmul_rn), so that alpha
             * is exactly 1 while the max stands; fused into one FFMA, scale_log2 * m_i - base would
             * be base's rounding error (up to 2^-10 at inputs x100), and l_i would drift by it. */
    #pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
    #pragma unroll
                for (int h = 0; h < 2; h++) {
                    float mx = m_i[mt][h];
    #pragma unroll
                    for (int nt = 0; nt < KT; nt++) mx = fmaxf(mx, fmaxf(S_ij[mt][nt][2 * h], S_ij[mt][nt][2 * h + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1)); /* the quad holds the row */
                    mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
                    const float base = mx == -INFINITY ? 0.f : __fmul_rn(mx, scale_log2);
                    const float alpha = exp2_approx(__fmul_rn(m_i[mt][h], scale_log2) - base);
                    m_i[mt][h] = mx;
                    float sum = 0.f;
    #pragma unroll
                    for (int nt = 0; nt < KT; nt++) {
                        const float p0 = exp2_approx(fmaf(S_ij[mt][nt][2 * h], scale_log2, -base));
                        const float p1 = exp2_approx(fmaf(S_ij[mt][nt][2 * h + 1], scale_log2, -base));
                        S_ij[mt][nt][2 * h] = p0, S_ij[mt][nt][2 * h + 1] = p1;
                        sum += p0 + p1;
                    }
                    l_i[mt][h] = alpha * l_i[mt][h] + sum;
    #pragma unroll
                    for (int nt = 0; nt < DT; nt++) O_acc[mt][nt][2 * h] *= alpha, O_acc[mt][nt][2 * h + 1] *= alpha;
                    if (t == 0 && q0 + row0 + mt * 16 + 8 * h + g < N) tally.add(CNT_ROW_CORRECT);
                }
            /* O_i += P_ij V_j, one k16 step of keys at a time. P_ij is packed into 16-bit A fragments
             * just before its step (two n8 key tiles' C layout is one k16 tile's A layout), so the
             * fp32 scores of a step die as its fragments are made: fewer registers live at once. Each
             * V fragment serves this warp's M_TILES row tiles. */
    #pragma unroll
            for (int kb = 0; kb < Bs / 16; kb++) {
                uint32_t P_ij[M_TILES][4];
    #pragma unroll
                for (int mt = 0; mt < M_TILES; mt++) {
                    P_ij[mt][0] = M::pack(S_ij[mt][2 * kb][0], S_ij[mt][2 * kb][1]);
                    P_ij[mt][1] = M::pack(S_ij[mt][2 * kb][2], S_ij[mt][2 * kb][3]);
                    P_ij[mt][2] = M::pack(S_ij[mt][2 * kb + 1][0], S_ij[mt][2 * kb + 1][1]);
                    P_ij[mt][3] = M::pack(S_ij[mt][2 * kb + 1][2], S_ij[mt][2 * kb + 1][3]);
                }
    #pragma unroll
                for (int n = 0; n < HeadDim; n += 16) {
                    uint32_t Vf[4]; /* B fragments: Vf[0..1] columns n..n+7, Vf[2..3] columns n+8.. */
                    ldmatrix_x4_trans_at(Vf, swizzle_step<HeadDim>(V_j, sb + kb * 16, n / 8));
    #pragma unroll
                    for (int mt = 0; mt < M_TILES; mt++) {
                        M::mma(O_acc[mt][n / 8], P_ij[mt], &Vf[0]);
                        M::mma(O_acc[mt][n / 8 + 1], P_ij[mt], &Vf[2]);
                    }
                }
            }
        }
    }

    /* The one normalization, O_i / l_i, and L = scale * m + log(l) in nats. O goes through this
     * warp's own rows of the Q tile in shared memory (no other warp reads them), then out in
     * 16-byte stores along each row. */
    __syncwarp(); /* every lane of this warp is past its last ldmatrix of these rows */
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = l_i[mt][h];
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            const float inv_l = sum > 0.f ? 1.f / sum : 0.f; /* an all-masked row gives O = 0 */
            const int r = row0 + mt * 16 + 8 * h + g, query = q0 + r;
            if (t == 0 && query < N) {
                tally.add(CNT_ROW_NORMALIZE);
                L[query] = m_i[mt][h] * scale_log2 * LN2 + logf(sum);
            }
#pragma unroll
            for (int nt = 0; nt < DT; nt++)
                *(uint32_t *)&Q_i[swizzle<HeadDim>(r, nt) + 2 * t] =
                    M::pack(O_acc[mt][nt][2 * h] * inv_l, O_acc[mt][nt][2 * h + 1] * inv_l);
        }
    __syncwarp(); /* this warp's O rows in shared memory before its lanes copy them out */
    constexpr int CHUNKS = HeadDim / 8;
    for (int c = lane; c < Tiles::ROWS_PER_WARP * CHUNKS; c += WARP_SIZE) {
        const int r = row0 + c / CHUNKS, chunk = c % CHUNKS, query = q0 + r;
        if (query < N)
            *(uint4 *)&O[(size_t)query * HeadDim + chunk * 8] = *(const uint4 *)&Q_i[swizzle<HeadDim>(r, chunk)];
    }
    tally.flush(counters);
}

/* ---- launcher ---- */

/* The HBM bytes the loop structure moves, with the tiles this device takes: Q once; K_j, V_j once
 * per Q tile that sees them; O and L once. (16-bit elements in both dtypes.) */
void hbm_bytes(const struct shape *sh, struct hbm_traffic *t)
{
    char why[160];
    double kv_rows = 0;
    with_tiles(sh->d, gpu_smem_limit(), why, sizeof why, [&](auto tl) {
        kv_rows = kv_rows_read<decltype(tl)>(sh);
        return 0;
    });
    const double heads = (double)sh->B * sh->H, d = sh->d, N = sh->N;
    t->Q = heads * N * d * 2;
    t->KV = heads * 2.0 * kv_rows * d * 2;
    t->O = heads * N * d * 2;
    t->O_work = 0;
    t->rowstats = heads * N * sizeof(float); /* L */
    t->q_reads = 1;
}

template <typename T, class Tiles, bool COUNT>
int launch(const struct attn_args *a, char *why, size_t n)
{
    const size_t smem = Tiles::smem_bytes;
    if (int rc = smem_optin(stage9_pipelined_kernel<T, Tiles, COUNT>, smem, Tiles::HeadDim, why, n)) return rc;

    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    if (bh > 2147483647LL) {
        snprintf(why, n, "batch * heads = %lld is more than a grid dimension holds (2^31 - 1)", bh);
        return ATTN_UNSUPPORTED;
    }
    /* (batch, head) in x, Q tiles in y: at most 2^20 / 64 = 16384 tiles, under y's 65535 */
    const dim3 grid((unsigned)bh, CEIL_DIV(sh->N, Tiles::Br));
    const dim3 block(Tiles::NTHREADS);
    stage9_pipelined_kernel<T, Tiles, COUNT><<<grid, block, smem>>>(
        (const T *)a->Q, (const T *)a->K, (const T *)a->V, (T *)a->O, a->L, sh->N, sh->causal,
        sh->scale * LOG2E, a->counters);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* dtype, head dim (its tiles: the first that fits this device) and counting build -> the kernel's
 * template arguments */
template <typename T, bool COUNT>
int dispatch_d(const struct attn_args *a, char *why, size_t n)
{
    return with_tiles(a->sh.d, gpu_smem_limit(), why, n,
                      [&](auto tl) { return launch<T, decltype(tl), COUNT>(a, why, n); });
}

template <typename T>
int dispatch(const struct attn_args *a, char *why, size_t n)
{
    return a->counters ? dispatch_d<T, true>(a, why, n) : dispatch_d<T, false>(a, why, n);
}

int forward(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype == DT_F16) return dispatch<__half>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch<__nv_bfloat16>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

/* The tiles forward takes where a block may have `limit` bytes (the summary names them). */
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    (void)backward; /* a forward only */
    return with_tiles(a->sh.d, limit, c->text, sizeof c->text, [&](auto tl) {
        typedef decltype(tl) Tl;
        return tiles_found(c, Tl::Br, Tl::Bc, Tl::smem_bytes, "Br=%d Bc=%d Bs=%d", Tl::Br, Tl::Bc, Tl::Bs);
    });
}

} // namespace

extern "C" const struct stage stage9_desc = {
    .name = "stage9",
    .idea = "FA-2's engineering: cp.async double buffer, swizzled smem + ldmatrix, exp2 with folded scale, tiles per d",
    .device = ON_GPU,
    .forward = forward,
    .backward = NULL,
    .dims = {32, 64, 128, 256},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = NULL,
    .openmp = 0,
    .hbm_traffic = hbm_bytes,
    .measures_backward = 0,
    .arch_sm = 0,
    .tiles = tiles_for,
};
