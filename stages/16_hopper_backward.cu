/* 16_hopper_backward.cu: the backward on Hopper: stage 10's algorithm with wgmma, TMA, a producer
 *   warp, and dQ added by the copy engine (FlashAttention-3's backward, section 3 of its paper)
 *
 * Changed from stage 10: the same three kernels (preprocess, the dK/dV kernel, convert) and the
 *   same arithmetic per K/V tile j and Q tile i,
 *       S = Q_i K_j^T,  P = exp2(scale log2e S - L_i log2e),  dP = dO_i V_j^T,  dS = P (dP - D_i)
 *       dV_j += P^T dO_i,  dK_j += scale dS^T Q_i,  dQ_i += scale dS K_j
 *   with Hopper's machinery in the dK/dV kernel (stage16_backward_kernel):
 *   1. the five products on wgmma. A block owns 128 keys, K_j and V_j resident in shared memory,
 *      and two consumer warpgroups of 64 keys each. Each warpgroup computes S^T and dP^T (its keys
 *      are the rows, the M of the wgmma) so that P^T and dS^T come out of the accumulators already
 *      in the register layout of a wgmma A operand: dV += P^T dO and dK += dS^T Q read them from
 *      registers, and dK_j, dV_j never leave the registers until the end;
 *   2. a producer warp streams Q_i, dO_i (TMA) and L_i, D_i (bulk copies) through a ring of
 *      full/empty mbarriers, stage 12's ring, while the consumers compute; setmaxnreg moves the
 *      producer warpgroup's registers to the consumers;
 *   3. dQ_i = dS K_j needs dS with queries for rows, the transpose of what the registers hold: dS^T
 *      goes to shared memory once, and the wgmma reads it back transposed (its A operand
 *      MN-major). Each block's fp32 dQ tile is staged in shared memory and added into the fp32
 *      accumulator in HBM by one bulk reduce-add (cp.reduce.async.bulk), issued by a dQ writer
 *      warp of its own: one instruction per tile instead of stage 10's float2 atomics;
 *   4. --deterministic: the blocks of a head add into each dQ tile in a fixed order of their K/V
 *      tiles (first to last; last to first under the causal mask, dq_turn), a counter per dQ tile
 *      (dq_sem) saying whose turn it is.
 * Why: stage 10's mma.sync backward reaches about 0.58x cuDNN's backward on an H100 or H200, whose
 *   tensor cores run wgmma at twice the rate of mma.sync; the backward is two thirds of training's
 *   attention time. The arithmetic (notes/16_hopper_backward.md): 5 products per tile pair against
 *   the forward's 2, so the backward is 2.5x the forward's flops.
 * Hopper only: compiled for sm_90a (the Makefile's HOPPER_STAGES); elsewhere it exits 3. d = 64
 *   and 128 (d = 256 does not fit: the note's shared-memory and register arithmetic).
 * Measured on an H200: notes/16_hopper_backward.md.
 * Run: ./stage16 --seqlen 4096 --dim 128 --causal  (add --deterministic for a dQ with the same bits every run)
 */
#include "common/attn.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* A configuration: HeadDim, Br (queries per Q tile, the N of S^T = K Q^T), STAGES (ring stages
 * of Q_i, dO_i, L_i, D_i) and DQ_ATOMICS (1: each consumer thread adds its dQ accumulators into HBM
 * by float2 atomics, stage 10's way, and the dQ writer idles; bench/ablations/16_dq_atomics.cu). A block owns Bc = 128 keys, 64 per consumer warpgroup (one wgmma's M).
 * Per consumer thread, the accumulators: dK_j and dV_j d/2 fp32 each, S^T and dP^T Br/2 each,
 * and while dV, dK and dQ run, P^T and dS^T packed (Br/4 each) and a dQ tile of 64 x 64 (32):
 *   d = 64,  Br = 128: dK 32 + dV 32 + S 64 + dP 64 = 192 during the softmax
 *   d = 128, Br = 64:  dK 64 + dV 64 + S 32 + dP 32 = 192
 * of the 240 a consumer thread has (setmaxnreg, below). Each block's dQ_i tile (Br x d) is cut in
 * two 64 x 64 pieces, one per warpgroup: by rows at d = 64 (Br = 128), by columns at d = 128.
 * Shared memory (tiles below): K_j, V_j; STAGES x (Q_i, dO_i, L_i, D_i); dS^T twice (the
 * warpgroups write the next while the other may still read this one); the fp32 dQ tile; L_i, D_i:
 *   d = 64:  K, V 32 + Q, dO 2 x 32 + dS^T 2 x 32 + dQ 32 + L, D 2 = 194 KiB
 *   d = 128: K, V 64 + Q, dO 2 x 32 + dS^T 2 x 16 + dQ 32 + L, D 1 = 193 KiB */
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { static constexpr int HeadDim = 64, Br = 128, STAGES = 2, DQ_ATOMICS = 0; };
template <>
struct cfg<128> { static constexpr int HeadDim = 128, Br = 64, STAGES = 2, DQ_ATOMICS = 0; };
constexpr int WARPGROUP = 4 * WARP_SIZE;
constexpr int CONSUMERS = 2;       /* consumer warpgroups, 64 keys each */
constexpr int PRODUCER_REGS = 24;  /* setmaxnreg, per thread of the producer warpgroup */
constexpr size_t SMEM_MAX = 227 * 1024;
/* named barriers (0 is __syncthreads'): the consumers' dS^T is complete; the dQ tile is staged
 * (the consumers arrive, the writer waits); the staging is free again (the writer arrives, the
 * consumers wait) */
constexpr int BAR_DS = 1, BAR_DQ_FULL = 2, BAR_DQ_EMPTY = 3;
constexpr int DQ_THREADS = CONSUMERS * WARPGROUP + WARP_SIZE; /* the consumers and the writer warp */

template <typename Cfg>
struct tiles {
    static constexpr int HeadDim = Cfg::HeadDim, Br = Cfg::Br, STAGES = Cfg::STAGES;
    static constexpr bool DQ_ATOMICS = Cfg::DQ_ATOMICS != 0;
    static constexpr int Bc = 64 * CONSUMERS;
    static constexpr int NTHREADS = (CONSUMERS + 1) * WARPGROUP; /* the consumers, then the producer warpgroup */
    static constexpr int NWARPS = CONSUMERS * 4;                /* consumer warps */
    static constexpr int LAUNCH_REGS = 65536 / NTHREADS / 8 * 8;
    static constexpr int CONSUMER_REGS = (LAUNCH_REGS * NTHREADS - PRODUCER_REGS * WARPGROUP) / (NWARPS * WARP_SIZE) / 8 * 8;
    /* dQ_i's 64 x 64 pieces: RB row blocks x (HeadDim / 64) column blocks, one per warpgroup */
    static constexpr int RB = Br / 64;
    static constexpr int PIECE = 64 * 64; /* floats in one piece */
    /* The layout: 16-bit tiles in the 128-byte swizzle (wgmma.cuh), each on a 1024-byte atom:
     * K_j, V_j [Bc][HeadDim]; Q_i, dO_i [STAGES][Br][HeadDim]; dS^T [2][Bc][Br]; then fp32: the dQ
     * tile [Br * HeadDim] (in the consumers' register order, below), L_i and D_i [STAGES][2][Br];
     * then the mbarriers full[STAGES], empty[STAGES], KV_full. */
    static constexpr size_t K_j = 0;
    static constexpr size_t V_j = K_j + 2 * (size_t)Bc * HeadDim;
    static constexpr size_t Q_i = V_j + 2 * (size_t)Bc * HeadDim;
    static constexpr size_t dO_i = Q_i + STAGES * 2 * (size_t)Br * HeadDim;
    static constexpr size_t dST = dO_i + STAGES * 2 * (size_t)Br * HeadDim;
    static constexpr size_t dQ_tile = dST + 2 * 2 * (size_t)Bc * Br;
    static constexpr size_t LD = dQ_tile + sizeof(float) * (size_t)Br * HeadDim;
    static constexpr size_t full = LD + sizeof(float) * STAGES * 2 * (size_t)Br;
    static constexpr size_t empty = full + STAGES * sizeof(uint64_t);
    static constexpr size_t KV_full = empty + STAGES * sizeof(uint64_t);
    static constexpr size_t bytes = KV_full + sizeof(uint64_t);
    static_assert(RB * (HeadDim / 64) == CONSUMERS, "dQ_i cuts into one 64 x 64 piece per consumer warpgroup");
    static_assert(Br % 64 == 0 && Br <= 256 && HeadDim % 64 == 0, "whole 64-element swizzle rows; a TMA box of <= 256 rows");
    static_assert(bytes <= SMEM_MAX, "fits the shared memory of one block");
    static_assert(PRODUCER_REGS * WARPGROUP + CONSUMER_REGS * NWARPS * WARP_SIZE <= LAUNCH_REGS * NTHREADS,
                  "the consumers take no more registers than the producer gives back");
};

/* ---- kernels ---- */

/* Per query row, into row-padded buffers (each head's rows rounded up to whole Q tiles, Tr Br):
 * D = rowsum(dO * O) in fp32 and L log2(e); past N, D = 0 and L = +inf, so that a query past N
 * gets P = exp2(-inf) = 0 in the dK/dV kernel. The fp32 dQ accumulator (the same padded rows x d
 * floats, in the kernel's own order) is zeroed on the way. d / 8 threads per row, 16 bytes of O
 * and dO each: stage 10's preprocessing, with the padding. */
constexpr int PRE_THREADS = 256;
template <typename T, int HeadDim>
__global__ void __launch_bounds__(PRE_THREADS)
stage16_preprocess_kernel(const T *__restrict__ O, const T *__restrict__ dO, const float *__restrict__ L,
                          float *__restrict__ Dsum, float *__restrict__ L2, float *__restrict__ dQ_acc, int N,
                          int padded, size_t rows)
{
    constexpr int THREADS_PER_ROW = HeadDim / 8; /* a power of 2 that divides 32: a row's threads share a warp */
    const size_t row = (size_t)blockIdx.x * (PRE_THREADS / THREADS_PER_ROW) + threadIdx.x / THREADS_PER_ROW;
    const int c = (threadIdx.x % THREADS_PER_ROW) * 8;
    const size_t head = row / padded;
    const int q = (int)(row % padded);
    const bool in_n = row < rows && q < N; /* no early return: every lane takes part in the shuffles */
    const size_t src = (head * N + q) * HeadDim + c;
    float acc = 0.f;
    if (in_n) {
        const uint4 o = *(const uint4 *)(O + src), g = *(const uint4 *)(dO + src);
        const T *op = (const T *)&o, *gp = (const T *)&g;
#pragma unroll
        for (int e = 0; e < 8; e++) acc += (float)op[e] * (float)gp[e];
    }
    if (row < rows) {
        float4 *z = (float4 *)(dQ_acc + row * HeadDim + c);
        z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int s = THREADS_PER_ROW / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, s);
    if (row < rows && threadIdx.x % THREADS_PER_ROW == 0) {
        Dsum[row] = in_n ? acc : 0.f;
        L2[row] = in_n ? L[head * N + q] * LOG2E : INFINITY;
    }
}

/* The fp32 dQ tile's order, shared by the kernel that writes it and the one that reads it. Piece
 * p (of one Q tile's two) holds rows 64 (p % RB) .., columns 64 (p / RB) ..; within a piece, float4
 * number nt * 128 + tid (tid the thread's rank in its warpgroup, nt its n8 column tile) holds that
 * thread's four accumulators of tile nt: rows g and g + 8 of its warp's 16, columns 2t, 2t + 1
 * (wgmma.cuh's layout). The writers store whole float4s, consecutive threads at consecutive
 * addresses: no bank conflicts, where row-major fp32 rows (256 or 512 bytes apart) would put the
 * 8 rows of a warp's store on the same banks. The accumulator in HBM is in the same order (the
 * bulk copy moves the bytes as they are), and the convert kernel puts dQ back into rows. */
template <typename Tiles>
struct dq_order {
    /* the row and column of the first of float4 k's four values (the others: +1 column, +8 rows) */
    static __device__ __forceinline__ void at(int k, int &row, int &col)
    {
        const int piece = k / (Tiles::PIECE / 4), r = k % (Tiles::PIECE / 4);
        const int nt = r / WARPGROUP, tid = r % WARPGROUP, lane = tid % WARP_SIZE;
        row = 64 * (piece % Tiles::RB) + 16 * (tid / WARP_SIZE) + (lane >> 2);
        col = 64 * (piece / Tiles::RB) + 8 * nt + 2 * (lane & 3);
    }
};

/* --deterministic: how many K/V tiles add into dQ tile i before tile j does. Without a mask every
 * K/V tile meets every Q tile and they take turns first to last: j of them. Under the mask, K/V
 * tile j starts at the diagonal (Q tile j Bc / Br) and goes down the Q tiles; first to last, each
 * would wait at every Q tile for tile 0, which starts at Q tile 0: the blocks of a head would
 * finish one after another, a staircase (notes/16_hopper_backward.md measured 1.74-1.82x the
 * time). Last to first, the tile nearest the diagonal adds first: the tiles that meet Q tile i
 * are 0 .. last = the one holding its last query, and tile j goes after last - j of them. A tile
 * j + 1 reaches Q tile i in fewer steps of its own than tile j does, so no block waits for long;
 * the launcher starts the K/V tiles in that order too, so that a block only waits for blocks
 * started before it. */
static __device__ __forceinline__ int dq_turn(int j, int i, int Tc, int Br, int Bc, int N, int causal)
{
    if (!causal) return j;
    const int last = min(Tc - 1, (min(N, (i + 1) * Br) - 1) / Bc);
    return last - j;
}

/* dK_j, dV_j for K/V tile j of head blockIdx.y, and its share of every dQ_i.
 * Warpgroups 0 and 1 compute (keys 64 wg .. 64 wg + 63 of the tile); warpgroup 2 is the producer
 * (its first warp streams the Q tiles, its second adds the dQ tiles into HBM, the other two leave).
 * DETERMINISTIC: the dQ additions in a fixed order of the K/V tiles (dq_turn). */
template <typename T, typename Cfg, bool DETERMINISTIC>
__global__ void __launch_bounds__(tiles<Cfg>::NTHREADS, 1)
stage16_backward_kernel(const __grid_constant__ CUtensorMap tmap_Q, const __grid_constant__ CUtensorMap tmap_K,
                        const __grid_constant__ CUtensorMap tmap_V, const __grid_constant__ CUtensorMap tmap_dO,
                        const float *__restrict__ L2, const float *__restrict__ Dsum, T *__restrict__ dK,
                        T *__restrict__ dV, float *__restrict__ dQ_acc, int *__restrict__ dq_sem, int N, int causal,
                        float scale_log2, float scale)
{
    typedef tiles<Cfg> Tiles;
    typedef mma16<T> M;
    constexpr int HeadDim = Tiles::HeadDim, Br = Tiles::Br, Bc = Tiles::Bc, STAGES = Tiles::STAGES;
    constexpr int QT = Br / 8;      /* n8 tiles of S^T, dP^T: the queries */
    constexpr int DT = HeadDim / 8; /* n8 tiles of dK_j, dV_j */
    extern __shared__ __align__(SW128_ATOM_BYTES) unsigned char smem[];
    T *K_j = (T *)(smem + Tiles::K_j), *V_j = (T *)(smem + Tiles::V_j);
    T *Q_buf = (T *)(smem + Tiles::Q_i), *dO_buf = (T *)(smem + Tiles::dO_i); /* [STAGES][Br][HeadDim] */
    T *dST = (T *)(smem + Tiles::dST);                                          /* [2][Bc][Br] */
    float *dQ_tile = (float *)(smem + Tiles::dQ_tile);
    float *LD = (float *)(smem + Tiles::LD); /* [STAGES]: L_i (log2 units), then D_i, Br each */
    uint64_t *full = (uint64_t *)(smem + Tiles::full);   /* [STAGES]: Q_i, dO_i, L_i, D_i have landed */
    uint64_t *empty = (uint64_t *)(smem + Tiles::empty); /* [STAGES]: every consumer thread is done with them */
    uint64_t *KV_full = (uint64_t *)(smem + Tiles::KV_full);

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int wg = tid / WARPGROUP; /* 0, 1: consumers; CONSUMERS: the producer warpgroup */
    const int Tc = CEIL_DIV(N, Bc);
    /* the K/V tile: in launch order, except --deterministic under a causal mask, last to first
     * (dq_turn) */
    const int j = DETERMINISTIC && causal ? Tc - 1 - (int)blockIdx.x : (int)blockIdx.x, bh = blockIdx.y;
    const int key0 = j * Bc; /* this block's first key */
    const int Tr = CEIL_DIV(N, Br);
    /* the Q tiles this K/V tile meets: all, or (causal) those with a query at or after key0 */
    const int i_first = causal ? key0 / Br : 0;
    const int n_iter = Tr - i_first;
    const size_t padded = (size_t)Tr * Br; /* a head's rows in the padded buffers */

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], Tiles::NWARPS * WARP_SIZE);
        mbar_init(KV_full, 1);
        mbar_fence_init();
    }
    __syncthreads();

    if (wg == CONSUMERS) {
        setmaxnreg_dec<PRODUCER_REGS>();
        if (warp == Tiles::NWARPS) {
            /* ---- the producer: K_j and V_j once, then Q_i, dO_i, L_i, D_i round the ring ---- */
            if (lane == 0) {
                tma_prefetch_map(&tmap_Q), tma_prefetch_map(&tmap_K), tma_prefetch_map(&tmap_V),
                    tma_prefetch_map(&tmap_dO);
                mbar_arrive_expect_tx(KV_full, 2 * 2 * Bc * HeadDim);
                for (int cb = 0; cb < HeadDim / 64; cb++) {
                    tma_load_3d(K_j + cb * Bc * 64, &tmap_K, KV_full, cb * 64, key0, bh);
                    tma_load_3d(V_j + cb * Bc * 64, &tmap_V, KV_full, cb * 64, key0, bh);
                }
                for (int it = 0; it < n_iter; it++) {
                    const int i = i_first + it, s = it % STAGES, round = it / STAGES;
                    if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                    /* the bytes announced, the copies issued, then the arrival (mbar_expect_tx) */
                    mbar_expect_tx(&full[s], 2 * 2 * Br * HeadDim + 2 * Br * sizeof(float));
                    for (int cb = 0; cb < HeadDim / 64; cb++) {
                        tma_load_3d(Q_buf + s * Br * HeadDim + cb * Br * 64, &tmap_Q, &full[s], cb * 64, i * Br, bh);
                        tma_load_3d(dO_buf + s * Br * HeadDim + cb * Br * 64, &tmap_dO, &full[s], cb * 64, i * Br, bh);
                    }
                    const size_t rows = bh * padded + (size_t)i * Br;
                    bulk_load_1d(LD + s * 2 * Br, L2 + rows, Br * sizeof(float), &full[s]);
                    bulk_load_1d(LD + s * 2 * Br + Br, Dsum + rows, Br * sizeof(float), &full[s]);
                    mbar_arrive(&full[s]);
                }
            }
        } else if (warp == Tiles::NWARPS + 1 && !Tiles::DQ_ATOMICS) {
            /* ---- the dQ writer: each Q tile's fp32 dQ tile, staged by the consumers, added into
             * HBM by one bulk reduce-add ---- */
            for (int it = 0; it < n_iter; it++) {
                const int i = i_first + it;
                named_barrier_sync(BAR_DQ_FULL, DQ_THREADS); /* both consumer warpgroups staged their piece */
                if (lane == 0) {
                    float *dst = dQ_acc + ((size_t)bh * Tr + i) * Br * HeadDim;
                    int *turn = dq_sem + (size_t)bh * Tr + i;
                    if constexpr (DETERMINISTIC) {
                        while (ld_acquire_gpu(turn) != dq_turn(j, i, Tc, Br, Bc, N, causal)) {
                        }
                        fence_proxy_async_global(); /* their additions, seen through the generic proxy, before ours */
                    }
                    bulk_reduce_add_f32(dst, dQ_tile, Br * HeadDim * sizeof(float));
                    bulk_commit();
                    if constexpr (DETERMINISTIC) {
                        bulk_wait<0>(); /* our additions done in HBM (and the tile read) */
                        fence_proxy_async_global();
                        __threadfence();
                        atomicAdd(turn, 1); /* the next K/V tile's turn */
                    } else {
                        bulk_wait_read<0>(); /* the tile read: the consumers may overwrite it */
                    }
                }
                __syncwarp();
                if (it + 1 < n_iter) named_barrier_arrive(BAR_DQ_EMPTY, DQ_THREADS);
            }
            if (lane == 0) bulk_wait<0>();
        }
        return;
    }

    /* ---- the consumers ---- */
    setmaxnreg_inc<Tiles::CONSUMER_REGS>();
    const int ww = warp % 4, g = lane >> 2, t = lane & 3;
    const int tid_wg = tid % WARPGROUP;
    /* this lane's keys in the tile: 64 wg + 16 ww + g + 8 h */
    const int my_key = 64 * wg + 16 * ww + g;
    /* The descriptors (wgmma.cuh), at each operand's first k16 step:
     *   S^T = K_w Q_i^T, dP^T = V_w dO_i^T: A = this warpgroup's 64 rows of K_j (V_j), K-major;
     *     B = Q_i (dO_i) [Br][d], K-major (B^T as stored: the queries are B's N)
     *   dV += P^T dO_i, dK += dS^T Q_i: A from registers; B = dO_i (Q_i) [Br][d] read with the
     *     queries as its k: MN-major, its 64-column blocks Br rows of 128 bytes apart
     *   dQ piece = dS K_j: A = dS^T [Bc][Br] read transposed (MN-major: queries are its M), the
     *     piece's 64 queries one column block of it; B = K_j [Bc][d] with the keys as its k:
     *     MN-major, the piece's 64 columns one column block */
    const unsigned K_s = smem_u32(K_j), V_s = smem_u32(V_j);
    const uint64_t K_w = wgmma_desc_kmajor(K_s + wg * 64 * SW128_ROW_BYTES);
    const uint64_t V_w = wgmma_desc_kmajor(V_s + wg * 64 * SW128_ROW_BYTES);
    const uint64_t Q_k = wgmma_desc_kmajor(smem_u32(Q_buf)), dO_k = wgmma_desc_kmajor(smem_u32(dO_buf));
    const uint64_t Q_mn = wgmma_desc_mnmajor(smem_u32(Q_buf), Br * SW128_ROW_BYTES);
    const uint64_t dO_mn = wgmma_desc_mnmajor(smem_u32(dO_buf), Br * SW128_ROW_BYTES);
    constexpr unsigned QO_STAGE_BYTES = 2 * Br * HeadDim, DST_BYTES = 2 * Bc * Br;
    const int piece_rb = wg % Tiles::RB, piece_cb = wg / Tiles::RB;
    const uint64_t dS_mn = wgmma_desc_mnmajor(smem_u32(dST) + piece_rb * Bc * SW128_ROW_BYTES, Bc * SW128_ROW_BYTES);
    const uint64_t K_mn = wgmma_desc_mnmajor(K_s + piece_cb * Bc * SW128_ROW_BYTES, Bc * SW128_ROW_BYTES);

    float dK_acc[DT][4], dV_acc[DT][4];
#pragma unroll
    for (int nt = 0; nt < DT; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) dK_acc[nt][c] = dV_acc[nt][c] = 0.f;

    mbar_wait(KV_full, 0);
    for (int it = 0; it < n_iter; it++) {
        const int i = i_first + it, s = it % STAGES, q0 = i * Br;
        mbar_wait(&full[s], (it / STAGES) & 1);

        /* S^T = K_w Q_i^T and dP^T = V_w dO_i^T, one group */
        float S[QT][4], dP[QT][4];
        const uint64_t Q_ks = wgmma_desc_step(Q_k, s * QO_STAGE_BYTES), dO_ks = wgmma_desc_step(dO_k, s * QO_STAGE_BYTES);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < HeadDim / 16; k++)
            wgmma_ss<T, Br, 0>(S, wgmma_desc_step(K_w, sw128_kmajor_step<Bc>(k)),
                               wgmma_desc_step(Q_ks, sw128_kmajor_step<Br>(k)), k > 0);
#pragma unroll
        for (int k = 0; k < HeadDim / 16; k++)
            wgmma_ss<T, Br, 0>(dP, wgmma_desc_step(V_w, sw128_kmajor_step<Bc>(k)),
                               wgmma_desc_step(dO_ks, sw128_kmajor_step<Br>(k)), k > 0);
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_hold(S);
        wgmma_hold(dP);

        /* Masks where needed: keys past N (the tail tile: their rows of K_j, V_j are zeros, but P
         * must be 0 there, not exp2(-L)) and, causal, keys after the query. Element [nt][c] is key
         * key0 + my_key + 8 (c >> 1), query q0 + 8 nt + 2t + (c & 1). */
        if (key0 + Bc > N || (causal && key0 + Bc - 1 > q0)) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int key = key0 + my_key + 8 * h;
#pragma unroll
                for (int nt = 0; nt < QT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int query = q0 + 8 * nt + 2 * t + e;
                        if (key >= N || (causal && key > query)) S[nt][2 * h + e] = -INFINITY;
                    }
            }
        }
        /* P^T = exp2(scale log2e S^T - L log2e), dS^T = P^T (dP^T - D): L and D are the columns'
         * (the queries'), each lane's 2 of every 8 */
        const float *L_s = LD + s * 2 * Br, *D_s = L_s + Br;
#pragma unroll
        for (int nt = 0; nt < QT; nt++) {
            const float2 Lq = *(const float2 *)&L_s[8 * nt + 2 * t], Dq = *(const float2 *)&D_s[8 * nt + 2 * t];
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float P = exp2_approx(fmaf(S[nt][c], scale_log2, -((c & 1) ? Lq.y : Lq.x)));
                S[nt][c] = P;
                dP[nt][c] = P * (dP[nt][c] - ((c & 1) ? Dq.y : Dq.x));
            }
        }
        /* P^T and dS^T packed to 16 bits: two n8 tiles' accumulator layout is one k16 step's A
         * layout (wgmma.cuh); dS^T also into shared memory for dQ, 4 bytes per row and tile */
        uint32_t Pa[QT / 2][4], dSa[QT / 2][4];
        T *dS_w = dST + (it & 1) * Bc * Br;
#pragma unroll
        for (int kb = 0; kb < QT / 2; kb++) {
            Pa[kb][0] = M::pack(S[2 * kb][0], S[2 * kb][1]);
            Pa[kb][1] = M::pack(S[2 * kb][2], S[2 * kb][3]);
            Pa[kb][2] = M::pack(S[2 * kb + 1][0], S[2 * kb + 1][1]);
            Pa[kb][3] = M::pack(S[2 * kb + 1][2], S[2 * kb + 1][3]);
            dSa[kb][0] = M::pack(dP[2 * kb][0], dP[2 * kb][1]);
            dSa[kb][1] = M::pack(dP[2 * kb][2], dP[2 * kb][3]);
            dSa[kb][2] = M::pack(dP[2 * kb + 1][0], dP[2 * kb + 1][1]);
            dSa[kb][3] = M::pack(dP[2 * kb + 1][2], dP[2 * kb + 1][3]);
            *(uint32_t *)&dS_w[sw128<Bc>(my_key, 2 * kb) + 2 * t] = dSa[kb][0];
            *(uint32_t *)&dS_w[sw128<Bc>(my_key + 8, 2 * kb) + 2 * t] = dSa[kb][1];
            *(uint32_t *)&dS_w[sw128<Bc>(my_key, 2 * kb + 1) + 2 * t] = dSa[kb][2];
            *(uint32_t *)&dS_w[sw128<Bc>(my_key + 8, 2 * kb + 1) + 2 * t] = dSa[kb][3];
        }
        fence_proxy_async_smem(); /* dS^T, written by ordinary stores, for the wgmma of both warpgroups */

        /* dV_j += P^T dO_i and dK_j += dS^T Q_i: A from registers, the queries as k */
        const uint64_t dO_ms = wgmma_desc_step(dO_mn, s * QO_STAGE_BYTES), Q_ms = wgmma_desc_step(Q_mn, s * QO_STAGE_BYTES);
        wgmma_hold(Pa);
        wgmma_hold(dSa);
        wgmma_fence();
#pragma unroll
        for (int kb = 0; kb < QT / 2; kb++)
            wgmma_rs<T, HeadDim, 1>(dV_acc, Pa[kb], wgmma_desc_step(dO_ms, sw128_mnmajor_step(kb)), 1);
#pragma unroll
        for (int kb = 0; kb < QT / 2; kb++)
            wgmma_rs<T, HeadDim, 1>(dK_acc, dSa[kb], wgmma_desc_step(Q_ms, sw128_mnmajor_step(kb)), 1);
        wgmma_commit();

        /* dQ's piece = dS K_j over the tile's 128 keys: both warpgroups' dS^T must be in */
        named_barrier_sync(BAR_DS, CONSUMERS * WARPGROUP);
        float dQ[8][4];
        wgmma_fence(); /* dQ's registers were last read by ordinary instructions (the previous piece) */
        const uint64_t dS_ms = wgmma_desc_step(dS_mn, (it & 1) * DST_BYTES);
#pragma unroll
        for (int kk = 0; kk < Bc / 16; kk++)
            wgmma_ss<T, 64, 1, 1>(dQ, wgmma_desc_step(dS_ms, sw128_mnmajor_step(kk)),
                                  wgmma_desc_step(K_mn, sw128_mnmajor_step(kk)), kk > 0);
        wgmma_commit();
        wgmma_wait<0>(); /* dV, dK and dQ done: Q_i, dO_i and this dS^T read */
        wgmma_hold(dQ);
        wgmma_hold(dK_acc);
        wgmma_hold(dV_acc);
        wgmma_hold(Pa);
        wgmma_hold(dSa);
        /* this thread is done with ring stage s: every consumer thread arrives, after its own
         * ordinary loads of L_i and D_i, before the producer's next bulk copy overwrites them */
        mbar_arrive(&empty[s]);

        if constexpr (Tiles::DQ_ATOMICS) {
            /* (the ablation) the piece straight from the registers into HBM, in the tile's order */
            float *to = dQ_acc + ((size_t)bh * Tr + i) * Br * HeadDim + wg * Tiles::PIECE + 4 * tid_wg;
#pragma unroll
            for (int nt = 0; nt < 8; nt++) {
                atomicAdd((float2 *)(to + 4 * nt * WARPGROUP), make_float2(dQ[nt][0], dQ[nt][1]));
                atomicAdd((float2 *)(to + 4 * nt * WARPGROUP + 2), make_float2(dQ[nt][2], dQ[nt][3]));
            }
            continue;
        }
        /* the piece into the staged dQ tile, once the writer has sent the last one */
        if (it > 0) named_barrier_sync(BAR_DQ_EMPTY, DQ_THREADS);
        float4 *piece = (float4 *)dQ_tile + wg * (Tiles::PIECE / 4);
#pragma unroll
        for (int nt = 0; nt < 8; nt++) piece[nt * WARPGROUP + tid_wg] = make_float4(dQ[nt][0], dQ[nt][1], dQ[nt][2], dQ[nt][3]);
        fence_proxy_async_smem(); /* for the copy engine */
        named_barrier_arrive(BAR_DQ_FULL, DQ_THREADS);
    }

    /* dK_j = scale dK, dV_j: this lane's rows key0 + my_key (+ 8), two columns per n8 tile */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int key = key0 + my_key + 8 * h;
        if (key >= N) continue;
        T *dK_row = dK + ((size_t)bh * N + key) * HeadDim, *dV_row = dV + ((size_t)bh * N + key) * HeadDim;
#pragma unroll
        for (int nt = 0; nt < DT; nt++) {
            *(uint32_t *)&dK_row[8 * nt + 2 * t] = M::pack(scale * dK_acc[nt][2 * h], scale * dK_acc[nt][2 * h + 1]);
            *(uint32_t *)&dV_row[8 * nt + 2 * t] = M::pack(dV_acc[nt][2 * h], dV_acc[nt][2 * h + 1]);
        }
    }
}

/* dQ = scale * the fp32 accumulator, back from the kernel's order (dq_order) into rows, in the
 * input dtype; rows past N (the padding of the last Q tile) are dropped. One float4 per thread and
 * step: two pairs of columns, rows 8 apart. */
template <typename T, typename Cfg>
__global__ void stage16_convert_kernel(const float *__restrict__ dQ_acc, T *__restrict__ dQ, size_t n4, int N,
                                       int Tr, float scale)
{
    typedef tiles<Cfg> Tiles;
    typedef mma16<T> M;
    constexpr int Br = Tiles::Br, HeadDim = Tiles::HeadDim, TILE4 = Br * HeadDim / 4;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n4; k += (size_t)gridDim.x * blockDim.x) {
        const size_t tile = k / TILE4; /* (head, Q tile) */
        int row, col;
        dq_order<Tiles>::at((int)(k % TILE4), row, col);
        const float4 v = ((const float4 *)dQ_acc)[k];
        const int q = (int)(tile % Tr) * Br + row;
        T *out = dQ + ((tile / Tr) * N + q) * HeadDim + col;
        if (q < N) *(uint32_t *)out = M::pack(scale * v.x, scale * v.y);
        if (q + 8 < N) *(uint32_t *)(out + 8 * HeadDim) = M::pack(scale * v.z, scale * v.w);
    }
}

/* ---- launcher ---- */

/* The workspace: first the forward's (stage 14's work-item counter, FWD_WORK bytes), then the fp32
 * dQ accumulator, L log2e and D (row-padded: B H Tr Br rows), then --deterministic's counters, one
 * per (head, Q tile). */
constexpr size_t FWD_WORK = 256;
extern "C" const struct stage stage14_desc;

template <typename Cfg>
struct workspace {
    float *dQ_acc, *L2, *Dsum;
    int *sem;
    static size_t bytes(const struct shape *sh)
    {
        const size_t heads = (size_t)sh->B * sh->H, tiles = heads * CEIL_DIV(sh->N, Cfg::Br), rows = tiles * Cfg::Br;
        return FWD_WORK + rows * Cfg::HeadDim * sizeof(float) + 2 * rows * sizeof(float) + tiles * sizeof(int);
    }
    workspace(void *work, const struct shape *sh)
    {
        const size_t heads = (size_t)sh->B * sh->H, rows = heads * CEIL_DIV(sh->N, Cfg::Br) * Cfg::Br;
        dQ_acc = (float *)((char *)work + FWD_WORK);
        L2 = dQ_acc + rows * Cfg::HeadDim;
        Dsum = L2 + rows;
        sem = (int *)(Dsum + rows);
    }
};

template <typename T, typename Cfg, bool DETERMINISTIC>
int launch(const struct attn_args *a, char *why, size_t n)
{
    typedef tiles<Cfg> Tiles;
    constexpr int HeadDim = Tiles::HeadDim, Br = Tiles::Br, Bc = Tiles::Bc;
    const size_t smem = Tiles::bytes;
    if (Tiles::DQ_ATOMICS && DETERMINISTIC) {
        snprintf(why, n, "dQ by atomics has no order: --deterministic needs the bulk reduce-add");
        return ATTN_UNSUPPORTED;
    }
    if (int rc = smem_optin(stage16_backward_kernel<T, Cfg, DETERMINISTIC>, smem, HeadDim, why, n)) return rc;
    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    if (bh > 65535) {
        snprintf(why, n, "batch * heads = %lld is more than a grid's y dimension holds (65535)", bh);
        return ATTN_UNSUPPORTED;
    }
    const int Tr = CEIL_DIV(sh->N, Br), Tc = CEIL_DIV(sh->N, Bc);
    const workspace<Cfg> w(a->work, sh);
    const T *O = (const T *)a->O, *dO = (const T *)a->dO;
    CUtensorMap tmap_Q, tmap_K, tmap_V, tmap_dO;
    if (int rc = tma_map_heads<T>(&tmap_Q, (const T *)a->Q, bh, sh->N, HeadDim, Br, why, n)) return rc;
    if (int rc = tma_map_heads<T>(&tmap_dO, dO, bh, sh->N, HeadDim, Br, why, n)) return rc;
    if (int rc = tma_map_heads<T>(&tmap_K, (const T *)a->K, bh, sh->N, HeadDim, Bc, why, n)) return rc;
    if (int rc = tma_map_heads<T>(&tmap_V, (const T *)a->V, bh, sh->N, HeadDim, Bc, why, n)) return rc;

    const size_t rows = (size_t)bh * Tr * Br;
    stage16_preprocess_kernel<T, HeadDim><<<(unsigned)CEIL_DIV(rows, PRE_THREADS / (HeadDim / 8)), PRE_THREADS>>>(
        O, dO, a->L, w.Dsum, w.L2, w.dQ_acc, sh->N, Tr * Br, rows);
    CUDA_TRY(cudaGetLastError());
    if (DETERMINISTIC) CUDA_TRY(cudaMemsetAsync(w.sem, 0, (size_t)bh * Tr * sizeof(int)));
    /* K/V tiles in x, so that a head's blocks start in the order of their K/V tile: under a causal
     * mask the first meet the most Q tiles (the longest blocks start first); with --deterministic
     * the order of dQ's additions is the order the blocks start in (a block never waits for one
     * that has not started), last to first under the mask (dq_turn) */
    stage16_backward_kernel<T, Cfg, DETERMINISTIC><<<dim3(Tc, (unsigned)bh), Tiles::NTHREADS, smem>>>(
        tmap_Q, tmap_K, tmap_V, tmap_dO, w.L2, w.Dsum, (T *)a->dK, (T *)a->dV, w.dQ_acc, w.sem, sh->N, sh->causal,
        sh->scale * LOG2E, sh->scale);
    CUDA_TRY(cudaGetLastError());
    const size_t n4 = rows * HeadDim / 4;
    const unsigned blocks = (unsigned)std::min<size_t>(CEIL_DIV(n4, 256), 65535);
    stage16_convert_kernel<T, Cfg><<<blocks, 256>>>(w.dQ_acc, (T *)a->dQ, n4, sh->N, Tr, sh->scale);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

template <template <int> class Cfg, typename T>
int dispatch(const struct attn_args *a, char *why, size_t n)
{
    switch (a->sh.d) {
    case 64: return a->deterministic ? launch<T, Cfg<64>, true>(a, why, n) : launch<T, Cfg<64>, false>(a, why, n);
    case 128: return a->deterministic ? launch<T, Cfg<128>, true>(a, why, n) : launch<T, Cfg<128>, false>(a, why, n);
    }
    snprintf(why, n, "supports head dim 64 or 128 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

template <template <int> class Cfg>
int backward(const struct attn_args *a, char *why, size_t n)
{
    if (a->work == NULL) {
        snprintf(why, n, "needs its workspace (the fp32 dQ accumulator, L and D) and got none");
        return ATTN_UNSUPPORTED;
    }
    if (a->dtype == DT_F16) return dispatch<Cfg, __half>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch<Cfg, __nv_bfloat16>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

template <template <int> class Cfg>
size_t workspace_bytes(const struct attn_args *a)
{
    switch (a->sh.d) {
    case 64: return workspace<Cfg<64>>::bytes(&a->sh);
    case 128: return workspace<Cfg<128>>::bytes(&a->sh);
    }
    return FWD_WORK;
}

/* The forward is stage 14's (O and L for the backward); its workspace is the first FWD_WORK bytes. */
int forward(const struct attn_args *a, char *why, size_t n)
{
    if (stage14_desc.workspace_bytes && stage14_desc.workspace_bytes(a) > FWD_WORK) {
        snprintf(why, n, "stage 14's forward needs more workspace than the %zu bytes set aside for it", FWD_WORK);
        return ATTN_UNSUPPORTED;
    }
    return stage14_desc.forward(a, why, n);
}

template <template <int> class Cfg>
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    if (!backward) return stage14_desc.tiles(a, 0, limit, c);
    auto found = [&](auto cfg) {
        typedef tiles<decltype(cfg)> Tiles;
        if (Tiles::bytes > limit) {
            snprintf(c->text, sizeof c->text, "d=%d needs %zu.%zu KiB of shared memory per block; this device allows %zu KiB%s",
                     Tiles::HeadDim, Tiles::bytes / 1024, Tiles::bytes % 1024 * 10 / 1024, limit / 1024, smem_cap_words(limit));
            return (int)ATTN_UNSUPPORTED;
        }
        return tiles_found(c, Tiles::Br, Tiles::Bc, Tiles::bytes, "Q tiles Br=%d, K/V tile Bc=%d, %d stages, 2 consumer warpgroups, dQ by %s%s",
                           Tiles::Br, Tiles::Bc, Tiles::STAGES, Tiles::DQ_ATOMICS ? "atomics" : "bulk reduce-add",
                           a->deterministic ? " in K/V-tile order" : "");
    };
    switch (a->sh.d) {
    case 64: return found(Cfg<64>{});
    case 128: return found(Cfg<128>{});
    }
    snprintf(c->text, sizeof c->text, "supports head dim 64 or 128 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

} // namespace

extern "C" const struct stage stage16_desc = {
    .name = "stage16",
    .idea = "Hopper backward: wgmma with dK, dV in registers, Q and dO streamed by TMA, dQ by bulk reduce-add",
    .device = ON_GPU,
    .forward = forward,
    .backward = backward<cfg>,
    .dims = {64, 128},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = workspace_bytes<cfg>,
    .openmp = 0,
    .hbm_traffic = NULL,
    .measures_backward = 1,
    .arch_sm = 90,
    .tiles = tiles_for<cfg>,
};
