/* 11_wgmma.cu: FlashAttention-2 forward on Hopper's warpgroup tensor cores (wgmma)
 *
 * Changed from stage 9: the algorithm, the grid and the pipeline stay (one block per Q tile,
 *   heaviest first, causal tiles skipped, K_{j+1}, V_{j+1} copied by cp.async while tile j
 *   computes, exp2 with the scale folded in); the two matmuls move from mma.sync to wgmma:
 *   - a warpgroup (four warps, 128 threads) owns 64 rows of the Q tile and issues each matmul as
 *     one asynchronous warpgroup MMA per k16 step (common/cuda/wgmma.cuh): S_ij = Q_i K_j^T is
 *     m64nBck16, d / 16 of them, and O_i += P_ij V_j is m64nDk16, Bc / 16 of them;
 *   - S_ij reads Q_i and K_j straight from shared memory through matrix descriptors (the SS form):
 *     no ldmatrix, no fragments in registers;
 *   - P_ij stays in registers as the A operand of P_ij V_j (the RS form); V_j, stored [keys][d],
 *     is the "MN-major" B operand, read transposed by the instruction itself;
 *   - shared memory in the layout wgmma reads: the 128-byte swizzle, tiles stored as 64-column
 *     blocks of 1024-byte atoms (stage 9's own swizzle keeps 256-byte rows at d = 128);
 *   - the online softmax works on the wgmma accumulators, which are stage 9's mma.sync C layout on
 *     each warp's 16 rows: the softmax code is stage 9's with one row tile per warp;
 *   - a wgmma runs asynchronously: O_i += P_ij V_j is issued and left running while the warpgroup
 *     crosses the next barrier and issues the next S = Q K^T, so the tensor cores go from one
 *     to the other without draining; this takes a third K/V buffer (the loop is turned to keep
 *     that window inside one iteration, as the compiler needs to keep wgmma asynchronous);
 *   - tile sizes per head dim for the new register budget (configuration below).
 * Why: an mma.sync is one warp's 16 x 8 x 16 product, its A and B fed through registers by
 *   ldmatrix; a wgmma is a warpgroup's 64 x N x 16 product that the tensor cores read from shared
 *   memory themselves, and only wgmma reaches Hopper's full tensor-core rate. Stage 9 runs at
 *   FlashAttention-2's speed, about a third of an H200's 989 TFLOP/s.
 * Hopper only: compiled for sm_90a (the Makefile's HOPPER_STAGES); elsewhere it exits 3.
 * Measured on H200: notes/11_wgmma.md.
 * Run: ./stage11 --batch 1 --heads 1 --seqlen 16384 --dim 128 --causal
 */
#include "common/attn.h"
#include "common/cuda/counters.cuh"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/softmax.cuh"
#include "common/cuda/wgmma.cuh"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* Two warpgroups per block at every head dim: a Q tile of Br = 128 rows, 64 per warpgroup (the M
 * of one wgmma), both reading the same K_j, V_j (one copy into shared memory serves 128 rows, as
 * in stage 9). Per thread a warpgroup's accumulators hold Bc / 2 fp32 of S_ij and HeadDim / 2 of
 * O_i, and P_ij takes Bc / 4 registers (16-bit pairs) that the tensor cores read until the wait:
 * all three live at once, under the 255 registers a thread may use (check -Xptxas -v). Bc is one
 * wgmma's N for S_ij. STAGES buffers of K_j and V_j: with three, O_i += P_ij V_j is left running
 * while the warpgroup crosses the next barrier and issues the next S = Q K^T (the loop below);
 * with two, it is waited for at once.
 *   d = 64:  Bc = 64, three buffers (64 KiB). Bc = 128 took 13-26% longer on the H200 (notes/11):
 *            the exponentials, as heavy as the matmuls here, wait on a wgmma of S twice as long.
 *   d = 128: Bc = 128, three buffers (224 KiB, just under the 227 KiB a block may have).
 *   d = 256: Bc = 64 (O_i alone is 128 registers), two buffers (192 KiB: three do not fit). */
constexpr int NWARPGROUPS = 2;
constexpr int NWARPS = 4 * NWARPGROUPS;
constexpr int WARPGROUP = 4 * WARP_SIZE; /* threads that issue one wgmma together */
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { static constexpr int Bc = 64, STAGES = 3; };   /* O 32 + S 32 + P 16 */
template <>
struct cfg<128> { static constexpr int Bc = 128, STAGES = 3; }; /* O 64 + S 64 + P 32 */
template <>
struct cfg<256> { static constexpr int Bc = 64, STAGES = 2; };  /* O 128 + S 32 + P 16 */

/* Everything derived from the configuration: tile sizes and the shared-memory layout. */
template <int HeadDim>
struct tiles {
    typedef cfg<HeadDim> C;
    static constexpr int Bc = C::Bc, STAGES = C::STAGES;
    /* the wgmma accumulators give each warp 16 rows of its warpgroup's 64: one m16 row tile */
    static constexpr int M_TILES = 1;
    static constexpr int NTHREADS = NWARPS * WARP_SIZE;
    static constexpr int ROWS_PER_WARP = 16 * M_TILES;
    static constexpr int Br = NWARPS * ROWS_PER_WARP;
    /* Q_i [Br][HeadDim], then STAGES buffers of K_j [Bc][HeadDim] and of V_j [Bc][HeadDim], all
     * 16-bit, in the 128-byte swizzle (wgmma.cuh): each starts on a 1024-byte atom */
    static constexpr size_t Q_i = 0;
    static constexpr size_t K_j = Q_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t V_j = K_j + STAGES * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t bytes = V_j + STAGES * 2 * (size_t)Bc * HeadDim;
    static_assert(Br == NWARPGROUPS * 64, "a warpgroup's rows are one wgmma's M, 64");
    static_assert(HeadDim % 64 == 0, "the 128-byte swizzle takes rows of whole 64-element blocks");
    static_assert(Bc % 16 == 0 && Bc >= 64, "Bc: one wgmma's N, and whole k16 steps of P_ij V_j");
    static_assert(STAGES == 2 || STAGES == 3, "two buffers, or three to leave P_ij V_j running");
    static_assert(K_j % SW128_ATOM_BYTES == 0 && V_j % SW128_ATOM_BYTES == 0 && 2 * Bc * HeadDim % SW128_ATOM_BYTES == 0,
                  "every tile on a 1024-byte atom");
};

/* ---- kernel ---- */

/* COUNT: the counting build for --counters (common/cuda/counters.cuh); the timed build has none. */
template <typename T, int HeadDim, bool COUNT>
__global__ void __launch_bounds__(tiles<HeadDim>::NTHREADS, 1)
stage11_wgmma_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                           T *__restrict__ O, float *__restrict__ L, int N, int causal, float scale_log2,
                           unsigned long long *counters)
{
    typedef tiles<HeadDim> Tiles;
    typedef mma16<T> M;
    constexpr int NTHREADS = Tiles::NTHREADS, M_TILES = Tiles::M_TILES, Br = Tiles::Br, Bc = Tiles::Bc, STAGES = Tiles::STAGES;
    constexpr int KT = Bc / 8;      /* key tiles: n8 tiles of S_ij */
    constexpr int DT = HeadDim / 8; /* dim tiles: n8 column tiles of O_i */
    extern __shared__ __align__(SW128_ATOM_BYTES) unsigned char smem[];
    T *Q_i = (T *)(smem + Tiles::Q_i);
    T *K_buf = (T *)(smem + Tiles::K_j); /* [STAGES][Bc][HeadDim] */
    T *V_buf = (T *)(smem + Tiles::V_j); /* [STAGES][Bc][HeadDim] */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE;
    const int wg = tid / WARPGROUP;             /* this thread's warpgroup: rows 64 wg .. 64 wg + 63 */
    const int row0 = warp * Tiles::ROWS_PER_WARP;  /* this warp's rows of Q_i, O_i (warp w of warpgroup
                                                    * wg owns rows 64 wg + 16 w .. + 15) */
    /* the matrix descriptors (wgmma.cuh), each at its operand's first k16 step; the others are
     * compile-time steps from them: Q_i and K_j K-major (rows contiguous along d), V_j MN-major
     * (its rows are the keys, P_ij V_j's k), its 64-column blocks Bc rows of 128 bytes apart */
    const uint64_t Q_desc = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(Q_i) + wg * 64 * SW128_ROW_BYTES);
    const uint64_t K_desc = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(K_buf));
    const uint64_t V_desc = wgmma_desc_mnmajor((unsigned)__cvta_generic_to_shared(V_buf), Bc * SW128_ROW_BYTES);
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
    const sw128_tile_loader<T, HeadDim, Bc, NTHREADS> kv_loader;
    load_tile_sw128<T, HeadDim, Br, NTHREADS>(Q_i, Q, q0, N);
    kv_loader.load(K_buf, K, 0, N);
    kv_loader.load(V_buf, V, 0, N);
    cp_async_commit();

    /* This lane's rows are row0 + 16 mt + 8 h + g (mt < M_TILES, h = 0, 1). m_i is the running
     * max of the raw scores (not yet scaled); l_i is this lane's part of the row sum (its 2 of
     * every 8 columns), added across the quad only at the end. P_ij is the A operand of
     * O_i += P_ij V_j, packed to 16 bits. */
    float O_acc[M_TILES][DT][4] = {};
    float m_i[M_TILES][2], l_i[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) m_i[mt][0] = m_i[mt][1] = -INFINITY, l_i[mt][0] = l_i[mt][1] = 0.f;
    uint32_t P_ij[Bc / 16][4];

    /* Tile j's K_j, V_j have landed: publish them to every warpgroup's tensor cores, and copy tile
     * j+1 into buffer (j+1) mod STAGES. The barrier also says every warpgroup is past its wait for
     * S_{i,j-1}, which (below) retired every wgmma of tile j-2, and with two buffers those of
     * tile j-1 too: so that buffer is free. */
    auto next_tile = [&](int j) {
        cp_async_wait<0>();
        fence_proxy_async_smem(); /* this thread's copies, made through the generic proxy, ordered
                                   * before the tensor cores read them through the async proxy */
        __syncthreads();
        if (j + 1 < n_tiles) {
            const int b = (j + 1) % STAGES;
            kv_loader.load(K_buf + b * Bc * HeadDim, K, (j + 1) * Bc, N);
            kv_loader.load(V_buf + b * Bc * HeadDim, V, (j + 1) * Bc, N);
        }
        cp_async_commit();
    };

    /* S_ij = Q_i K_j^T, masked, through the online softmax into P_ij; O_i rescaled. */
    auto scores = [&](int j) {
        const uint64_t K_j = wgmma_desc_step(K_desc, (j % STAGES) * TILE_BYTES);
        const int key0 = j * Bc; /* first key of this tile */
        /* S_ij = Q_i K_j^T (raw: the scale is applied inside the exponential), this warpgroup's
         * 64 rows: one m64nBck16 wgmma per k16 step of the head dim, the first one overwriting
         * S_ij (accumulate = 0), all in one group. S_ij[0] and O_acc[0]: a warp's one row tile.
         * With three buffers O_i += P_{i,j-1} V_{j-1} is still running: the tensor cores take
         * this group right after it, and the wait covers both. */
        float S_ij[M_TILES][KT][4];
        wgmma_fence(); /* S_ij's registers were last written by ordinary instructions (tile j-1) */
#pragma unroll
        for (int k = 0; k < HeadDim / 16; k++)
            wgmma_ss<T, Bc, 0>(S_ij[0], wgmma_desc_step(Q_desc, sw128_kmajor_step<Br>(k)),
                               wgmma_desc_step(K_j, sw128_kmajor_step<Bc>(k)), k > 0);
        wgmma_commit();
        wgmma_wait<0>(); /* S_ij in registers (and O_i += P_{i,j-1} V_{j-1} done) */
        wgmma_hold(S_ij[0]);
        wgmma_hold(O_acc[0]);
        wgmma_hold(P_ij);

        /* Masks, only on the tiles that need them: the tail tile (keys past N) and, when causal,
         * the tiles that cross the diagonal (some key after some query of this tile). */
        if (key0 + Bc > N || (causal && key0 + Bc - 1 > q0)) mask_scores(S_ij, key0, q0 + row0, N, causal);

        /* The online softmax (softmax.cuh): S_ij -> P_ij in place, m_i and l_i updated; O_i *= alpha */
        float alpha[M_TILES][2];
        online_softmax(S_ij, m_i, l_i, alpha, scale_log2);
        scale_rows(O_acc, alpha);
        count_rows<M_TILES>(tally, CNT_ROW_CORRECT, q0 + row0, N);
        /* P_ij packed into 16-bit A fragments: two n8 key tiles' C layout is one k16 step's A
         * layout (wgmma.cuh) */
#pragma unroll
        for (int kb = 0; kb < Bc / 16; kb++) {
            P_ij[kb][0] = M::pack(S_ij[0][2 * kb][0], S_ij[0][2 * kb][1]);
            P_ij[kb][1] = M::pack(S_ij[0][2 * kb][2], S_ij[0][2 * kb][3]);
            P_ij[kb][2] = M::pack(S_ij[0][2 * kb + 1][0], S_ij[0][2 * kb + 1][1]);
            P_ij[kb][3] = M::pack(S_ij[0][2 * kb + 1][2], S_ij[0][2 * kb + 1][3]);
        }
    };

    /* The loop, turned so that O_i += P_ij V_j is issued and left running while the warpgroup
     * crosses the barrier, issues the next copies and the next S = Q K^T:
     *   tile 0:          publish, S_i0 -> P_i0
     *   tile j:          O_i += P_ij V_j (issued) | publish tile j+1, S_{i,j+1} -> P_{i,j+1}
     * With two buffers (d = 256, where three do not fit) P_ij V_j is waited for at once instead:
     * the copy of tile j+2 goes into V_j's buffer. */
    next_tile(0);
    scores(0);
    for (int j = 0; j < n_tiles; j++) {
        /* O_i += P_ij V_j: one m64nDk16 wgmma per k16 step of keys, all in one group */
        const uint64_t V_j = wgmma_desc_step(V_desc, (j % STAGES) * TILE_BYTES);
        wgmma_hold(O_acc[0]);
        wgmma_hold(P_ij);
        wgmma_fence(); /* O_acc (rescaled) and P_ij were just written by ordinary instructions */
#pragma unroll
        for (int kb = 0; kb < Bc / 16; kb++)
            wgmma_rs<T, HeadDim, 1>(O_acc[0], P_ij[kb], wgmma_desc_step(V_j, sw128_mnmajor_step(kb)), 1);
        wgmma_commit();
        if constexpr (STAGES == 2) {
            wgmma_wait<0>(); /* O_i updated; V_j and P_ij read */
            wgmma_hold(O_acc[0]);
            wgmma_hold(P_ij);
        }
        if (j + 1 < n_tiles) {
            next_tile(j + 1);
            scores(j + 1);
        }
    }
    wgmma_wait<0>(); /* the last O_i += P_ij V_j */
    wgmma_hold(O_acc[0]);

    /* The one normalization, O_i / l_i, and L = scale * m + log(l) in nats. O goes through this
     * warp's own rows of the Q tile in shared memory, then out in 16-byte stores along each row. */
    __syncthreads(); /* a warpgroup's wgmma reads all 64 of its rows of Q_i: no warp overwrites its
                      * rows before every warp of its warpgroup is past its last wgmma */
    normalize_rows(O_acc, m_i, l_i, L, q0 + row0, N, scale_log2, tally);
    store_rows_sw128<Br, HeadDim>(O_acc, Q_i, O, q0, row0, N);
    tally.flush(counters);
}

/* ---- launcher ---- */

/* The HBM bytes the loop structure moves: Q once; K_j, V_j once per Q tile that sees them; O and L
 * once. (16-bit elements in both dtypes.) */
void hbm_bytes(const struct shape *sh, struct hbm_traffic *t)
{
    const double kv_rows = sh->d == 64 ? kv_rows_read<tiles<64>>(sh) : sh->d == 128 ? kv_rows_read<tiles<128>>(sh)
                           : kv_rows_read<tiles<256>>(sh);
    const double heads = (double)sh->B * sh->H, d = sh->d, N = sh->N;
    t->Q = heads * N * d * 2;
    t->KV = heads * 2.0 * kv_rows * d * 2;
    t->O = heads * N * d * 2;
    t->O_work = 0;
    t->rowstats = heads * N * sizeof(float); /* L */
    t->q_reads = 1;
}

template <typename T, int HeadDim, bool COUNT>
int launch(const struct attn_args *a, char *why, size_t n)
{
    typedef tiles<HeadDim> Tiles;
    const size_t smem = Tiles::bytes;
    if (int rc = smem_optin(stage11_wgmma_kernel<T, HeadDim, COUNT>, smem, HeadDim, why, n)) return rc;

    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    if (bh > 2147483647LL) {
        snprintf(why, n, "batch * heads = %lld is more than a grid dimension holds (2^31 - 1)", bh);
        return ATTN_UNSUPPORTED;
    }
    /* (batch, head) in x, Q tiles in y: at most 2^20 / 128 = 8192 tiles, under y's 65535 */
    const dim3 grid((unsigned)bh, CEIL_DIV(sh->N, Tiles::Br));
    const dim3 block(Tiles::NTHREADS);
    stage11_wgmma_kernel<T, HeadDim, COUNT><<<grid, block, smem>>>(
        (const T *)a->Q, (const T *)a->K, (const T *)a->V, (T *)a->O, a->L, sh->N, sh->causal,
        sh->scale * LOG2E, a->counters);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* dtype, head dim and counting build -> the kernel's template arguments */
template <typename T, bool COUNT>
int dispatch_d(const struct attn_args *a, char *why, size_t n)
{
    switch (a->sh.d) {
    case 64: return launch<T, 64, COUNT>(a, why, n);
    case 128: return launch<T, 128, COUNT>(a, why, n);
    case 256: return launch<T, 256, COUNT>(a, why, n);
    }
    snprintf(why, n, "supports head dim 64, 128 or 256 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
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

} // namespace

extern "C" const struct stage stage11_desc = {
    .name = "stage11",
    .idea = "Hopper: the matmuls on warpgroup MMA (wgmma) from 128-byte-swizzled shared memory, P in registers",
    .device = ON_GPU,
    .forward = forward,
    .backward = NULL,
    .dims = {64, 128, 256},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = NULL,
    .openmp = 0,
    .hbm_traffic = hbm_bytes,
    .measures_backward = 0,
    .arch_sm = 90,
};
