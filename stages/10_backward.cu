/* 10_backward.cu: FlashAttention-2 backward (FA-2 paper, section 3.2 and Algorithm 2)
 *
 * New in stage 10: the backward, built on stage 9's forward. The gradients dQ, dK, dV of the loss
 *   sum(dO * O), from Q, K, V, dO and what stage 9's forward leaves behind: O and the row
 *   logsumexp L. Three kernels:
 *   1. stage10_preprocess_kernel: per query row D_i = rowsum(dO_i * O_i) and L_i in log2 units
 *      (and the fp32 dQ accumulator zeroed);
 *   2. stage10_dkdv_kernel, parallel over K/V tiles (grid = K/V tiles x batch*heads): a block keeps
 *      its K_j, V_j and their gradients dK_j, dV_j on chip and sweeps the Q tiles:
 *        S_ij = scale Q_i K_j^T,  P_ij = exp(S_ij - L_i)       recomputed, never stored
 *        dV_j += P_ij^T dO_i,  dP_ij = dO_i V_j^T,  dS_ij = P_ij * (dP_ij - D_i)
 *        dK_j += scale dS_ij^T Q_i,  dQ_i += scale dS_ij K_j   (fp32 atomics into HBM)
 *   3. stage10_convert_kernel: dQ from the fp32 accumulator to the input dtype.
 *   With --deterministic the adds into dQ are put in an order (dq_kernel_for chooses how). Where a
 *   K/V tile is 128 keys (d <= 128): a head's K/V tiles are cut into S splits (one wave of blocks:
 *   dq_splits), block s of a head takes its split's tiles one after the other and adds into an
 *   fp32 accumulator of its own, and stage10_convert_splits_kernel sums the S accumulators in
 *   order: the same bits on every run, for S - 1 more accumulators read (FlashAttention-2's
 *   deterministic mode). Where a K/V tile is 64 keys (d = 256), the dK/dV kernel skips dQ and
 *   stage10_dq_kernel computes it, parallel over Q tiles with dQ_i in registers, no atomics, at the
 *   price of recomputing S and dP once more; its three products all have queries for rows, so it
 *   is laid out and engineered as stage 9's forward (a warp owns whole rows, end to end).
 *   bench/ablations/10_dq_kernel.cu takes the dQ kernel at every d, to time it against the splits.
 * Why this shape: dK_j and dV_j sum over every query, dQ_i over every key; a block can own one of
 *   the two sums and must share the other. FA-2 owns dK, dV (two accumulators on chip) and adds
 *   dQ into HBM. P is recomputed from Q, K and L rather than stored: storing it is N^2 per head,
 *   the very memory FlashAttention exists to avoid.
 * The engineering is stage 9's (swizzled tiles and their ldmatrix fragments from
 *   common/cuda/swizzle.cuh, each lane's addresses computed once and stepped by constants,
 *   cp.async, exp2 with the scale folded in, masks only where needed), plus: the next Q_i, dO_i,
 *   L_i, D_i are copied in while this one computes (double buffer); each step runs in three
 *   phases with a warp layout of its own, P^T and dS^T passing through shared memory (FA-2's
 *   arrangement: it makes each ldmatrix feed more mma); a block owns 128 keys so every dQ row gets
 *   half as many atomic adds as with 64 (64 keys at d = 256, where registers hold no more); each
 *   add is a float2 (sm_90: one atomic for two columns).
 * Measured on H200: see notes/10_backward.md.
 * Run: ./stage10 --seqlen 4096 --dim 64 --causal  (add --deterministic for a dQ with the same bits every run)
 */
#include "common/attn.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/swizzle.cuh"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* The dK/dV kernel: KV_WARPS warps, a K/V tile of Bc keys, Q swept in tiles of Br queries. Each
 * step has three phases, and the warps split the work differently in each (FA-2's arrangement):
 *   A. S^T = K_j Q_i^T and dP^T = V_j dO_i^T, then P^T and dS^T: a warp takes KEYS_PER_WARP_A keys
 *      x QUERIES_PER_WARP_A queries;
 *   B. dV_j += P^T dO_i, dK_j += dS^T Q_i: a warp takes 32 keys x COLS_PER_WARP_B columns (its
 *      accumulators), the Bc / 32 key groups each split the d columns among KV_WARPS / (Bc / 32)
 *      warps;
 *   C. dQ_i += dS K_j: a warp takes 32 queries x COLS_PER_WARP_C columns, the same way.
 * The tiles are FA-2's for the sm80 backward: Bc = 128 keys and Br = 128 queries at d = 32 and 64,
 * 64 at d = 128; Bc = Br = 64 at d = 256, where phase B's 32 keys x d/2 would be 256 fp32
 * accumulators per thread: with 64 keys each warp owns 32 keys x d/4, the 128 registers of d = 128.
 * KEYS_PER_WARP_A and UNROLL_A are the choices measured fastest without spilling at d = 64 and 128
 * (notes/10_backward.md); d = 32 takes d = 64's, d = 256 FA-2's phase A split (32 keys x 16
 * queries). Shared memory (kv_smem_layout below) comes to 114, 162, 161 and 209 KiB at d = 32, 64,
 * 128, 256: d = 256's fit an H100 or H200 (227 KiB per block) alone.
 * Where a GPU allows a block less, launch takes the first configuration of the head dim's list
 * below that fits (common/cuda/launch.cuh): a smaller Q tile first, then a smaller K/V tile too,
 * with four warps where phases A to C do not divide the smaller tiles among eight. d = 256 has
 * none for 99 KiB or less: Q_i and dO_i, double-buffered, are 64 KiB at Br = 32 alone (100.5 KiB
 * in all with four warps and Bc = 32); there the launch refuses it with first_fit's message. */
template <int HeadDim, int Br, int Bc>
struct kv_smem_layout;
/* One configuration: KV_WARPS warps, Br, Bc, and phase A's split. UNROLL_A: how many k16 steps of
 * phase A's loop over the head dim are unrolled (d = 32 has 2). */
template <int HeadDim_, int KV_WARPS_, int Br_, int Bc_, int KEYS_PER_WARP_A_, int UNROLL_A_>
struct kv_tiles {
    static constexpr int HeadDim = HeadDim_, KV_WARPS = KV_WARPS_, Br = Br_, Bc = Bc_;
    static constexpr int KEYS_PER_WARP_A = KEYS_PER_WARP_A_, UNROLL_A = UNROLL_A_;
    static constexpr size_t smem_bytes = kv_smem_layout<HeadDim, Br, Bc>::bytes;
};
/* Per head dim, fastest first (the first is the H100/H200's; the A100, 163 KiB, runs it too but
 * at d = 256). The shared memory of each in the comment: 99 KiB fits an RTX 30, 40 or 50 card,
 * 64 KiB a T4. */
template <int HeadDim>
struct kv_cfg;
template <>
struct kv_cfg<32> { typedef config_list<kv_tiles<32, 8, 128, 128, 64, 2>,          /* 114 KiB */
                                        kv_tiles<32, 4, 64, 128, 64, 2>,           /* 65 KiB */
                                        kv_tiles<32, 4, 64, 64, 32, 2>> list; };   /* 41 KiB */
template <>
struct kv_cfg<64> { typedef config_list<kv_tiles<64, 8, 128, 128, 64, 4>,          /* 162 KiB */
                                        kv_tiles<64, 8, 64, 128, 32, 4>,           /* 97 KiB */
                                        kv_tiles<64, 4, 32, 64, 32, 4>> list; };   /* 40.5 KiB */
template <>
struct kv_cfg<128> { typedef config_list<kv_tiles<128, 8, 64, 128, 32, 4>,        /* 161 KiB */
                                         kv_tiles<128, 8, 32, 64, 16, 4>,         /* 72.5 KiB */
                                         kv_tiles<128, 4, 32, 32, 16, 4>> list; }; /* 52.5 KiB */
template <>
struct kv_cfg<256> { typedef config_list<kv_tiles<256, 8, 64, 64, 32, 4>,         /* 209 KiB */
                                         kv_tiles<256, 8, 32, 64, 16, 4>> list; }; /* 136.5 KiB */

/* The dQ kernel (--deterministic). Per K/V tile it computes S = Q_i K_j^T, dP = dO_i V_j^T,
 * dS = P * (dP - D) and dQ_i += dS K_j: three products whose rows are all the Q tile's queries,
 * like the forward's two. So it is laid out as stage 9's forward, not as the dK/dV kernel: a warp
 * owns 16 M_TILES whole rows end to end, S, dP and dS stay in its registers (dS becomes the A
 * operand of dS K_j as P does of P V_j in stage 9), and each K or V fragment it loads serves its
 * M_TILES row tiles. The dK/dV kernel works in phases because it holds two accumulators (dK_j,
 * dV_j: too many registers for warps of 32 whole key rows) and because its third product, dQ, has
 * queries for rows where the other four have keys; the dQ kernel has one accumulator and every
 * product has queries for rows. Per warp and sub-tile, mma per ldmatrix.x4: 3.0 at d = 32 and 64,
 * 2.4 at d = 128, 1.5 at d = 256 (with one row tile per warp it would be 1.7, 1.7, 1.7 and 1.5).
 * The dK/dV layout mirrored onto dQ (eight warps splitting S and dP, dS through shared memory,
 * dQ split by columns) would get 2.0, 2.4, 2.2 and 1.6 and add dS's stores and a second barrier
 * to every step; the dK/dV kernel itself gets 2.2 at d = 64 and 128.
 * A configuration (dq_tiles): WARPS warps of 16 M_TILES rows, so Br = 16 M_TILES WARPS queries;
 * K/V tiles of Bc keys, worked through Bs at a time as in stage 9. A thread holds dQ_i, 16 M_TILES
 * x d / 32 fp32, beside S and dP for a sub-tile, 16 M_TILES x Bs / 32 each (192 registers at
 * d = 64 and 128 in the first configurations, as many as the dK/dV kernel's accumulators).
 * Shared memory (dq_smem_layout): 49, 97, 97 and 193 KiB at d = 32, 64, 128, 256 in the first, so
 * two blocks of four warps share an SM at d <= 128 (which is why Bc = 32 at d = 128, where Q_i
 * and dO_i take 64 KiB). At d = 256 dQ_i alone is 128 registers for 16 rows, so a warp owns one
 * row tile and eight warps make Br = 128; like the dK/dV kernel there, it needs an H100 or H200's
 * 227 KiB per block. Where a GPU allows a block less, launch takes the first that fits, as for
 * the dK/dV kernel. Up to d = 128 the last of each list fits wherever the dK/dV kernel's last
 * does (static_assert in with_tiles_d), so --deterministic runs wherever the backward runs; at
 * d = 256 the loader needs eight warps (32 chunks a row, whole 8-row groups), so Br = 128 and
 * Q_i, dO_i alone take 128 KiB: the last takes 161 KiB, which an A100's 163 KiB holds. */
template <int HeadDim, int Br, int Bc>
struct dq_smem_layout;
template <int HeadDim_, int WARPS_, int M_TILES_, int Bc_, int Bs_>
struct dq_tiles {
    static constexpr int HeadDim = HeadDim_, WARPS = WARPS_, M_TILES = M_TILES_, Bc = Bc_, Bs = Bs_;
    static constexpr int Br = WARPS * 16 * M_TILES, THREADS = WARPS * WARP_SIZE;
    static constexpr size_t smem_bytes = dq_smem_layout<HeadDim, Br, Bc>::bytes;
};
/* Per head dim, fastest first; registers per thread in the comment. The smaller ones trade load
 * reuse for shared memory: a smaller Bc (more barriers per key), then M_TILES = 1 (each K or V
 * fragment feeds one row tile).
 * (Eight warps per block, Br = 256, one block per SM at d = 64 and 128, is slower than two blocks
 * of four: notes/10_backward.md, "Tried, and why it lost".) */
template <int HeadDim>
struct dq_cfg;
template <>
struct dq_cfg<32> { typedef config_list<dq_tiles<32, 4, 2, 128, 64>,           /* 49 KiB; dQ 32 + S, dP 128 */
                                        dq_tiles<32, 4, 2, 64, 64>> list; };   /* 33 KiB */
template <>
struct dq_cfg<64> { typedef config_list<dq_tiles<64, 4, 2, 128, 64>,           /* 97 KiB; dQ 64 + S, dP 128 */
                                        dq_tiles<64, 4, 2, 32, 32>,            /* 49 KiB */
                                        dq_tiles<64, 4, 1, 32, 32>> list; };   /* 32.5 KiB */
template <>
struct dq_cfg<128> { typedef config_list<dq_tiles<128, 4, 2, 32, 32>,          /* 97 KiB; dQ 128 + S, dP 64 */
                                         dq_tiles<128, 4, 1, 16, 16>> list; }; /* 48.5 KiB */
template <>
struct dq_cfg<256> { typedef config_list<dq_tiles<256, 8, 1, 32, 32>,          /* 193 KiB; dQ 128 + S, dP 32 */
                                         dq_tiles<256, 8, 1, 16, 16>> list; }; /* 161 KiB */

/* Shared memory of the dK/dV kernel: K_j, V_j [Bc][HeadDim]; Q_i, dO_i [2][Br][HeadDim]
 * (double-buffered); P^T, dS^T [Bc][Br] (16-bit); L_i, D_i [2][Br]. Tiles are swizzled
 * (common/cuda/swizzle.cuh). */
template <int HeadDim, int Br_, int Bc_>
struct kv_smem_layout {
    static constexpr int Br = Br_, Bc = Bc_;
    static constexpr size_t K_j = 0;
    static constexpr size_t V_j = K_j + 2 * (size_t)Bc * HeadDim;
    static constexpr size_t Q_i = V_j + 2 * (size_t)Bc * HeadDim;
    static constexpr size_t dO_i = Q_i + 2 * 2 * (size_t)Br * HeadDim;
    static constexpr size_t PT = dO_i + 2 * 2 * (size_t)Br * HeadDim;
    static constexpr size_t dST = PT + 2 * (size_t)Bc * Br;
    static constexpr size_t L_i = dST + 2 * (size_t)Bc * Br;
    static constexpr size_t D_i = L_i + sizeof(float) * 2 * Br;
    static constexpr size_t bytes = D_i + sizeof(float) * 2 * Br;
};
/* ... and of the dQ kernel: Q_i, dO_i [Br][HeadDim] (loaded once), then K_j [2][Bc][HeadDim] and
 * V_j [2][Bc][HeadDim] (double-buffered), then L_i, D_i [Br] (fp32, loaded once). */
template <int HeadDim, int Br_, int Bc_>
struct dq_smem_layout {
    static constexpr int Br = Br_, Bc = Bc_;
    static constexpr size_t Q_i = 0;
    static constexpr size_t dO_i = Q_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t K_j = dO_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t V_j = K_j + 2 * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t L_i = V_j + 2 * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t D_i = L_i + sizeof(float) * Br;
    static constexpr size_t bytes = D_i + sizeof(float) * Br;
};

/* ---- kernels ---- */

/* Two n8 C tiles (16 x 16 fp32, this lane's 8 values) as one k16 A fragment in 16-bit. */
template <typename T>
__device__ __forceinline__ void pack_A(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = mma16<T>::pack(c0[0], c0[1]);
    a[1] = mma16<T>::pack(c0[2], c0[3]);
    a[2] = mma16<T>::pack(c1[0], c1[1]);
    a[3] = mma16<T>::pack(c1[2], c1[3]);
}

/* dst[0] += a, dst[1] += b in global memory (8-byte aligned): one float2 atomic on sm_90 and
 * later, two float atomics before. */
__device__ __forceinline__ void atomic_add2(float *dst, float a, float b)
{
#if __CUDA_ARCH__ >= 900
    atomicAdd((float2 *)dst, make_float2(a, b));
#else
    atomicAdd(dst, a);
    atomicAdd(dst + 1, b);
#endif
}

/* Per query row: D_i = rowsum(dO_i * O_i) in fp32 and L_i * log2(e); the row's fp32 dQ
 * accumulator zeroed. d / 8 threads per row, 16 bytes of O and dO each, so the loads are whole
 * 128-byte lines: this kernel and the convert below only stream memory, and at N = 1024 they are
 * several per cent of the backward. */
constexpr int PRE_THREADS = 256;
template <typename T, int HeadDim>
__global__ void __launch_bounds__(PRE_THREADS)
stage10_preprocess_kernel(const T *__restrict__ O, const T *__restrict__ dO, const float *__restrict__ L,
                         float *__restrict__ Dsum, float *__restrict__ L2, float *__restrict__ dQ_acc, size_t rows)
{
    constexpr int THREADS_PER_ROW = HeadDim / 8; /* a power of 2 that divides 32: a row's threads share a warp */
    const size_t row = (size_t)blockIdx.x * (PRE_THREADS / THREADS_PER_ROW) + threadIdx.x / THREADS_PER_ROW;
    const int c = (threadIdx.x % THREADS_PER_ROW) * 8;
    const bool valid = row < rows; /* no early return: every lane takes part in the shuffles */
    float acc = 0.f;
    if (valid) {
        const uint4 o = *(const uint4 *)(O + row * HeadDim + c), g = *(const uint4 *)(dO + row * HeadDim + c);
        const T *op = (const T *)&o, *gp = (const T *)&g;
#pragma unroll
        for (int e = 0; e < 8; e++) acc += (float)op[e] * (float)gp[e];
        if (dQ_acc) {
            float4 *z = (float4 *)(dQ_acc + row * HeadDim + c);
            z[0] = z[1] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
#pragma unroll
    for (int s = THREADS_PER_ROW / 2; s > 0; s >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, s);
    if (valid && threadIdx.x % THREADS_PER_ROW == 0) {
        Dsum[row] = acc;
        L2[row] = L[row] * LOG2E;
    }
}

/* dK_j, dV_j for one K/V tile, and, where with_dq, this tile's share of dQ (by atomics, or with
 * SPLITS into the split's own accumulator).
 * Why three phases: with each warp on 16 keys against the whole Q tile, all in registers (P^T and
 * dS^T never leaving them), every Q or dO fragment a warp loads feeds only two mma, and
 * shared-memory reads are the limit (1.74 mma per ldmatrix.x4 at d = 128). Writing P^T and dS^T
 * to shared memory once lets each phase pick the warp layout that reuses its loads: per step and
 * warp, 144 ldmatrix.x4 feed 320 mma at d = 64 and 128 (2.2). */
template <typename T, class Cfg, bool SPLITS>
__global__ void __launch_bounds__(Cfg::KV_WARPS * WARP_SIZE)
stage10_dkdv_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                   const T *__restrict__ dO, const float *__restrict__ L2, const float *__restrict__ Dsum,
                   T *__restrict__ dK, T *__restrict__ dV, float *__restrict__ dQ_acc, int N, int causal,
                   float scale, int with_dq)
{
    constexpr int HeadDim = Cfg::HeadDim, KV_WARPS = Cfg::KV_WARPS, KV_THREADS = KV_WARPS * WARP_SIZE;
    typedef kv_smem_layout<HeadDim, Cfg::Br, Cfg::Bc> Smem;
    typedef mma16<T> M;
    constexpr int Br = Smem::Br, Bc = Smem::Bc; /* queries per Q tile, keys per K/V tile */
    /* phase A: keys and queries per warp, and the m16 key tiles and n8 query tiles they make */
    constexpr int KEYS_PER_WARP_A = Cfg::KEYS_PER_WARP_A;
    constexpr int QUERIES_PER_WARP_A = Bc * Br / (KV_WARPS * KEYS_PER_WARP_A);
    constexpr int KEY_TILES_A = KEYS_PER_WARP_A / 16, QUERY_TILES_A = QUERIES_PER_WARP_A / 8;
    /* phase B: the Bc keys in KEY_GROUPS_B groups of 32; the KV_WARPS / KEY_GROUPS_B warps on one
     * group split the d columns, COLS_PER_WARP_B each */
    constexpr int KEY_GROUPS_B = Bc / 32, COLS_PER_WARP_B = HeadDim * KEY_GROUPS_B / KV_WARPS;
    /* phase C: the Br queries in QUERY_GROUPS_C groups of 32; the KV_WARPS / QUERY_GROUPS_C warps
     * on one group split the d columns, COLS_PER_WARP_C each */
    constexpr int QUERY_GROUPS_C = Br / 32, COLS_PER_WARP_C = HeadDim * QUERY_GROUPS_C / KV_WARPS;
    static_assert(KEYS_PER_WARP_A % 16 == 0 && QUERIES_PER_WARP_A % 16 == 0 &&
                      (Bc / KEYS_PER_WARP_A) * (Br / QUERIES_PER_WARP_A) == KV_WARPS,
                  "phase A's warps cover Bc x Br in whole 16 x 16 blocks: (Bc / KEYS_PER_WARP_A) x (Br / "
                  "QUERIES_PER_WARP_A) warps");
    static_assert(Bc % 32 == 0 && KV_WARPS % KEY_GROUPS_B == 0 && COLS_PER_WARP_B % 16 == 0 &&
                      Br % 32 == 0 && KV_WARPS % QUERY_GROUPS_C == 0 && COLS_PER_WARP_C % 16 == 0,
                  "phases B and C cover the tiles exactly: B (Bc / 32) x (HeadDim / COLS_PER_WARP_B) warps, "
                  "C (Br / 32) x (HeadDim / COLS_PER_WARP_C), each column share whole k16 steps");
    static_assert(2 * Br <= KV_THREADS, "one thread per L_i and per D_i element of a Q tile");
    constexpr int UNROLL_A = Cfg::UNROLL_A;
    static_assert(HeadDim % (16 * UNROLL_A) == 0 && (HeadDim == 16 * UNROLL_A || (2 * UNROLL_A) % 8 == 0),
                  "phase A's rolled loop advances by whole 128-byte lines of chunks (swizzle_step below)");
    static_assert((COLS_PER_WARP_B & (COLS_PER_WARP_B - 1)) == 0 && (COLS_PER_WARP_C & (COLS_PER_WARP_C - 1)) == 0,
                  "a warp's first column in phases B and C is a multiple of its power-of-two share, so the "
                  "chunk steps within the share never carry into it (the swizzle_steps below)");
    extern __shared__ __align__(128) unsigned char smem[];
    /* the tiles hold T; ldmatrix only moves 16-bit patterns, so they are addressed as __half */
    __half *K_j = (__half *)(smem + Smem::K_j), *V_j = (__half *)(smem + Smem::V_j);
    __half *Q_buf = (__half *)(smem + Smem::Q_i), *dO_buf = (__half *)(smem + Smem::dO_i); /* [2][Br][HeadDim] */
    __half *PT_s = (__half *)(smem + Smem::PT), *dST_s = (__half *)(smem + Smem::dST);     /* [Bc][Br] */
    float *L_buf = (float *)(smem + Smem::L_i), *D_buf = (float *)(smem + Smem::D_i);     /* [2][Br] */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const size_t bh = blockIdx.y, head = bh * N * HeadDim;
    /* this warp's part in phase A (KEYS_PER_WARP_A keys x QUERIES_PER_WARP_A queries), B (32 keys x
     * COLS_PER_WARP_B columns), C (32 queries x COLS_PER_WARP_C columns): its first key, query or
     * column */
    const int keyA = (warp % (Bc / KEYS_PER_WARP_A)) * KEYS_PER_WARP_A;
    const int qA = (warp / (Bc / KEYS_PER_WARP_A)) * QUERIES_PER_WARP_A;
    const int keyB = (warp % KEY_GROUPS_B) * 32, colB = (warp / KEY_GROUPS_B) * COLS_PER_WARP_B;
    const int qC = (warp % QUERY_GROUPS_C) * 32, colC = (warp / QUERY_GROUPS_C) * COLS_PER_WARP_C;
    const float scale_log2 = scale * LOG2E;
    const int Tr = CEIL_DIV(N, Br);

    /* This lane's ldmatrix addresses (32-bit shared), computed once: the first fragment of each
     * operand of each phase. Every other fragment is a compile-time swizzle_step from one of them
     * (common/cuda/swizzle.cuh), as in stage 9, instead of a swizzle recomputed per fragment (a
     * tenth of the step's instructions at d = 128). V_j lies a fixed distance after K_j, dO_i
     * after Q_i and dS^T after P^T, so one address serves both tiles of a pair (the distance
     * becomes an ldmatrix immediate), and the Q buffer in use adds b * Q_BUF once per step. A
     * step moves by whole 8-row groups (the lane's row mod 8, so its XOR pattern, stays) and by
     * an even number of chunks, in bits the lane's own chunk leaves clear: that chunk is 0 or 1
     * plus, in phases B and C, the warp's first column, a multiple of its power-of-two share
     * (static_assert above), and the steps stay inside the share. */
    const unsigned smem_s = (unsigned)__cvta_generic_to_shared(smem);
    constexpr unsigned V_OFF = Smem::V_j - Smem::K_j, dO_OFF = Smem::dO_i - Smem::Q_i, dS_OFF = Smem::dST - Smem::PT;
    constexpr unsigned Q_BUF = 2 * Br * HeadDim; /* bytes of one Q_i (or dO_i) buffer */
    /* A: K_j (V_j) rows keyA.. as A fragments; Q_i (dO_i) rows qA.. as B fragments (the tile holds B^T) */
    const unsigned K_A = swizzle_addr<HeadDim>(smem_s + Smem::K_j, keyA + a_order_row(lane), a_order_chunk(lane));
    const unsigned Q_A = swizzle_addr<HeadDim>(smem_s + Smem::Q_i, qA + b_order_row(lane), b_order_chunk(lane));
    /* B: P^T (dS^T) rows keyB.. as A; dO_i (Q_i) columns colB.. as B (its rows are k: .trans) */
    const unsigned PT_B = swizzle_addr<Br>(smem_s + Smem::PT, keyB + a_order_row(lane), a_order_chunk(lane));
    const unsigned Q_B = swizzle_addr<HeadDim>(smem_s + Smem::Q_i, a_order_row(lane), colB / 8 + a_order_chunk(lane));
    /* C: dS^T columns qC.. read transposed as dS's A fragments; K_j columns colC.. as B (.trans) */
    const unsigned dST_C = swizzle_addr<Br>(smem_s + Smem::dST, b_order_row(lane), qC / 8 + b_order_chunk(lane));
    const unsigned K_C = swizzle_addr<HeadDim>(smem_s + Smem::K_j, a_order_row(lane), colC / 8 + a_order_chunk(lane));

    /* Q tile i into buffer b: Q_i and dO_i rows, and L_i, D_i, all by cp.async. Rows past N read as
     * zeros: Q = dO = 0 and L = D = 0 there give P = 1 but dP = 0, so dS = 0, and dO = 0 adds
     * nothing to dV: such a query contributes nothing, and its dQ row is never written. Each
     * thread's addresses are worked out once (swizzled_tile_loader, common/cuda/swizzle.cuh):
     * the tiles are loaded on every step. Threads 0 .. Br-1 copy L_i, Br .. 2Br-1 D_i. */
    const swizzled_tile_loader<T, HeadDim, Br, KV_THREADS> q_loader;
    const int r_LD = tid % Br;
    const float *LD_src = (tid < Br ? L2 : Dsum) + bh * N;
    float *LD_dst = (tid < Br ? L_buf : D_buf) + r_LD;
    auto load_q_tile = [&](int i, int b) {
        q_loader.load(Q_buf + b * Br * HeadDim, Q + head, i * Br, N);
        q_loader.load(dO_buf + b * Br * HeadDim, dO + head, i * Br, N);
        if (tid < 2 * Br) {
            const int q = i * Br + r_LD;
            cp_async_4_zfill(LD_dst + b * Br, LD_src + (q < N ? q : 0), q < N);
        }
    };

    /* K/V tile j: its dK_j, dV_j, and its share of dQ added into dQ_dst (the first tile of a split,
     * store_dq, stores it instead: below) */
    auto kv_tile = [&](const int j, float *dQ_dst, const bool store_dq) {
        /* causal: Q tiles wholly above the diagonal (every query before every key of K_j) see none of it */
        const int i_first = causal ? (j * Bc) / Br : 0;
        load_tile_swizzled<T, HeadDim, Bc, KV_THREADS>(K_j, K + head, j * Bc, N);
        load_tile_swizzled<T, HeadDim, Bc, KV_THREADS>(V_j, V + head, j * Bc, N);
        load_q_tile(i_first, 0);
        cp_async_commit();

        /* phase B's 32 keys x COLS_PER_WARP_B */
        float dK_acc[2][COLS_PER_WARP_B / 8][4] = {}, dV_acc[2][COLS_PER_WARP_B / 8][4] = {};

        for (int i = i_first, b = 0; i < Tr; i++, b ^= 1) {
            cp_async_wait<0>();
            __syncthreads(); /* tile i in buffer b; every warp is done with step i-1 (buffer b^1, P^T, dS^T free) */
            if (i + 1 < Tr) load_q_tile(i + 1, b ^ 1);
            cp_async_commit();
            const unsigned buf = b * Q_BUF; /* Q_i, dO_i: buffer b */
            const float *L_i = L_buf + b * Br, *D_i = D_buf + b * Br;

            /* A. S^T = K_j Q_i^T, then dP^T = V_j dO_i^T, for this warp's KEYS_PER_WARP_A keys x
             * QUERIES_PER_WARP_A queries (one product at a time: their fragments need not be live
             * together) */
            float ST[KEY_TILES_A][QUERY_TILES_A][4] = {}, dPT[KEY_TILES_A][QUERY_TILES_A][4] = {};
            auto product = [&](float C[KEY_TILES_A][QUERY_TILES_A][4], unsigned A_at, unsigned B_at) {
                /* UNROLL_A k16 steps at a time, each fragment a compile-time step from A_at, B_at, which
                 * then move on by 2 UNROLL_A chunks: whole 128-byte lines, a plain add */
#pragma unroll 1
                for (int k0 = 0; k0 < HeadDim; k0 += 16 * UNROLL_A) {
#pragma unroll
                    for (int k = 0; k < 16 * UNROLL_A; k += 16) {
                        uint32_t Af[KEY_TILES_A][4];
#pragma unroll
                        for (int m = 0; m < KEY_TILES_A; m++)
                            ldmatrix_x4_at(Af[m], swizzle_step<HeadDim>(A_at, 16 * m, k / 8));
#pragma unroll
                        for (int qb = 0; qb < QUERY_TILES_A / 2; qb++) {
                            uint32_t Bf[4];
                            ldmatrix_x4_at(Bf, swizzle_step<HeadDim>(B_at, 16 * qb, k / 8));
#pragma unroll
                            for (int m = 0; m < KEY_TILES_A; m++) {
                                M::mma(C[m][2 * qb], Af[m], &Bf[0]);
                                M::mma(C[m][2 * qb + 1], Af[m], &Bf[2]);
                            }
                        }
                    }
                    A_at = swizzle_step<HeadDim>(A_at, 0, 2 * UNROLL_A);
                    B_at = swizzle_step<HeadDim>(B_at, 0, 2 * UNROLL_A);
                }
            };
            product(ST, K_A, Q_A + buf);
            product(dPT, K_A + V_OFF, Q_A + buf + dO_OFF);
            /* Masks, only on the warps that need them: S^T = -inf (so P^T = 0) where the key is past N
             * or, causal, after the query. C layout: ST[m][nt][c] is key key_w + g + 16 m + 8 (c >> 1),
             * query q_w + 2t + 8 nt + (c & 1). A warp whose keys all come before N and before its
             * first query keeps every score. Elsewhere each of this lane's key rows gets, once, the
             * first query offset 8 nt + (c & 1) it keeps: none past N, from its own query on when
             * causal; then a score costs one compare with a constant. */
            const int key_w = j * Bc + keyA, q_w = i * Br + qA; /* this warp's first key and query */
            if (key_w + KEYS_PER_WARP_A > N || (causal && key_w + KEYS_PER_WARP_A - 1 > q_w)) {
#pragma unroll
                for (int m = 0; m < KEY_TILES_A; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int key = key_w + g + 16 * m + 8 * h;
                        const int first = key >= N ? INT_MAX : causal ? key - (q_w + 2 * t) : INT_MIN;
#pragma unroll
                        for (int nt = 0; nt < QUERY_TILES_A; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                if (8 * nt + e < first) ST[m][nt][2 * h + e] = -INFINITY;
                    }
            }
            /* P^T = exp2(scale log2e S^T - L log2e) and dS^T = P^T (dP^T - D), both to shared memory in
             * 16-bit. A masked score gives exp2(-inf) = 0 (L is finite on every row: a row past N reads
             * L = 0), and dS^T = 0 with it. */
#pragma unroll
            for (int nt = 0; nt < QUERY_TILES_A; nt++) {
                /* this lane's two queries: their L and D read once, for all its keys */
                const int ql = qA + nt * 8 + 2 * t;
                const float2 Lq = *(const float2 *)&L_i[ql], Dq = *(const float2 *)&D_i[ql];
#pragma unroll
                for (int m = 0; m < KEY_TILES_A; m++) {
                    float p[4], ds[4];
#pragma unroll
                    for (int c = 0; c < 4; c++) {
                        p[c] = exp2_approx(fmaf(ST[m][nt][c], scale_log2, -((c & 1) ? Lq.y : Lq.x)));
                        ds[c] = p[c] * (dPT[m][nt][c] - ((c & 1) ? Dq.y : Dq.x));
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int at = swizzle<Br>(keyA + 16 * m + g + 8 * h, qA / 8 + nt) + 2 * t;
                        *(uint32_t *)&PT_s[at] = M::pack(p[2 * h], p[2 * h + 1]);
                        *(uint32_t *)&dST_s[at] = M::pack(ds[2 * h], ds[2 * h + 1]);
                    }
                }
            }
            __syncthreads(); /* P^T and dS^T of all Bc keys x Br queries in shared memory */

            /* B. dV += P^T dO_i, dK += dS^T Q_i for 32 keys x COLS_PER_WARP_B columns, over the Br queries */
#pragma unroll
            for (int qk = 0; qk < Br; qk += 16) {
                uint32_t Pa[2][4], dSa[2][4];
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    ldmatrix_x4_at(Pa[m], swizzle_step<Br>(PT_B, 16 * m, qk / 8));
                    ldmatrix_x4_at(dSa[m], swizzle_step<Br>(PT_B, 16 * m, qk / 8) + dS_OFF);
                }
#pragma unroll
                for (int n = 0; n < COLS_PER_WARP_B; n += 16) {
                    uint32_t dOf[4], Qf[4];
                    ldmatrix_x4_trans_at(dOf, swizzle_step<HeadDim>(Q_B, qk, n / 8) + buf + dO_OFF);
                    ldmatrix_x4_trans_at(Qf, swizzle_step<HeadDim>(Q_B, qk, n / 8) + buf);
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        M::mma(dV_acc[m][n / 8], Pa[m], &dOf[0]);
                        M::mma(dV_acc[m][n / 8 + 1], Pa[m], &dOf[2]);
                        M::mma(dK_acc[m][n / 8], dSa[m], &Qf[0]);
                        M::mma(dK_acc[m][n / 8 + 1], dSa[m], &Qf[2]);
                    }
                }
            }

            if (!with_dq) continue;
            /* C. dQ_i += dS K_j for 32 queries x COLS_PER_WARP_C columns, over the Bc keys; fp32 atomics
             * into HBM */
            float dQ_part[2][COLS_PER_WARP_C / 8][4] = {};
#pragma unroll
            for (int kb = 0; kb < Bc; kb += 16) {
                uint32_t dSa[2][4]; /* A = dS (queries x keys) = the stored dS^T, transposed */
#pragma unroll
                for (int m = 0; m < 2; m++) ldmatrix_x4_trans_at(dSa[m], swizzle_step<Br>(dST_C, kb, 2 * m));
#pragma unroll
                for (int n = 0; n < COLS_PER_WARP_C; n += 16) {
                    uint32_t Kf[4];
                    ldmatrix_x4_trans_at(Kf, swizzle_step<HeadDim>(K_C, kb, n / 8));
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        M::mma(dQ_part[m][n / 8], dSa[m], &Kf[0]);
                        M::mma(dQ_part[m][n / 8 + 1], dSa[m], &Kf[2]);
                    }
                }
            }
            /* this lane's dQ rows are q_C + 16 m + 8 h: one address for the first, the others a constant
             * distance on. Rows at or past N are skipped, tested only in a tail tile. */
            const int q_C = i * Br + qC + g;
            float *dQ_C = dQ_dst + head + (size_t)q_C * HeadDim + colC + 2 * t;
            auto add_dQ = [&](bool tail) {
#pragma unroll
                for (int m = 0; m < 2; m++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (tail && q_C + 16 * m + 8 * h >= N) continue;
#pragma unroll
                        for (int nt = 0; nt < COLS_PER_WARP_C / 8; nt++) {
                            float *at = dQ_C + (16 * m + 8 * h) * HeadDim + nt * 8;
                            if (SPLITS && store_dq)
                                *(float2 *)at = make_float2(dQ_part[m][nt][2 * h], dQ_part[m][nt][2 * h + 1]);
                            else
                                atomic_add2(at, dQ_part[m][nt][2 * h], dQ_part[m][nt][2 * h + 1]);
                        }
                    }
            };
            if ((i + 1) * Br <= N) add_dQ(false);
            else add_dQ(true);
        }

        /* dK_j = scale dS^T Q, dV_j = P^T dO: phase B's 32 keys x COLS_PER_WARP_B, to HBM in the input dtype */
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int key = j * Bc + keyB + 16 * m + g + 8 * h;
                if (key >= N) continue;
#pragma unroll
                for (int nt = 0; nt < COLS_PER_WARP_B / 8; nt++) {
                    const size_t at = head + (size_t)key * HeadDim + colB + nt * 8 + 2 * t;
                    *(uint32_t *)&dK[at] = M::pack(scale * dK_acc[m][nt][2 * h], scale * dK_acc[m][nt][2 * h + 1]);
                    *(uint32_t *)&dV[at] = M::pack(dV_acc[m][nt][2 * h], dV_acc[m][nt][2 * h + 1]);
                }
            }
    };

    if constexpr (!SPLITS) {
        kv_tile(blockIdx.x, dQ_acc, false); /* this block's K/V tile; dQ by atomics (unless with_dq is 0) */
    } else {
        /* --deterministic: block s of the S = gridDim.x splits of this head takes the K/V tiles
         * j = s, 2S - 1 - s, 2S + s, 4S - 1 - s, ... (a snake, so that under a causal mask every
         * split gets about as many Q tiles), one after the other, and adds their shares of dQ into
         * its own accumulator, dQ_acc's split s: the first tile stores, the next ones add, each
         * element by the same thread every time, so in the same order on every run. The convert
         * kernel then sums the S accumulators in order of s. */
        /* (S, s and the split's accumulator from the launch's registers on every tile: kept live
         * across the loop they cost the d = 128 kernel a spill) */
        for (int k = 0;; k++) {
            const int S = gridDim.x, s = blockIdx.x;
            const int j = k * S + ((k & 1) ? S - 1 - s : s);
            if (j >= CEIL_DIV(N, Bc)) break;
            if (k) __syncthreads(); /* every warp done with the last tile's K_j, V_j, buffers and P^T */
            kv_tile(j, dQ_acc + (size_t)s * gridDim.y * N * HeadDim, k == 0);
        }
    }
}

/* --deterministic: dQ_i for one Q tile, summed over the K/V tiles in order in registers, each warp
 * its own 16 M_TILES rows. It recomputes S and dP (the dK/dV kernel keeps neither) and writes
 * dQ in the input dtype: no fp32 accumulator in HBM, no atomics, the same bits on every run. The
 * engineering is stage 9's forward's: K_j, V_j double-buffered by cp.async (with the tile loader's
 * per-thread addresses computed once), each lane's ldmatrix addresses computed once and stepped
 * by constants, masks only on the warps and sub-tiles that need them, the rows out through shared
 * memory in 16-byte stores. */
template <typename T, class Dq>
__global__ void __launch_bounds__(Dq::THREADS)
stage10_dq_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                 const T *__restrict__ dO, const float *__restrict__ L2, const float *__restrict__ Dsum,
                 T *__restrict__ dQ, int N, int causal, float scale)
{
    constexpr int HeadDim = Dq::HeadDim;
    typedef dq_smem_layout<HeadDim, Dq::Br, Dq::Bc> Smem;
    typedef mma16<T> M;
    constexpr int THREADS = Dq::THREADS, Br = Dq::Br, Bc = Dq::Bc; /* queries per Q tile, keys per K/V tile */
    constexpr int M_TILES = Dq::M_TILES, Bs = Dq::Bs;
    constexpr int ROWS_PER_WARP = 16 * M_TILES;
    constexpr int KT = Bs / 8;      /* key tiles: n8 tiles of S, dP in a sub-tile of Bs keys */
    constexpr int DT = HeadDim / 8; /* dim tiles: n8 column tiles of dQ_i */
    static_assert(Bs % 16 == 0 && Bc % Bs == 0, "sub-tiles are whole k16 steps of dS K_j and divide Bc");
    extern __shared__ __align__(128) unsigned char smem[];
    /* the tiles hold T; ldmatrix and cp.async only move 16-bit patterns, so they are addressed as __half */
    __half *Q_i = (__half *)(smem + Smem::Q_i), *dO_i = (__half *)(smem + Smem::dO_i);
    __half *K_buf = (__half *)(smem + Smem::K_j), *V_buf = (__half *)(smem + Smem::V_j); /* [2][Bc][HeadDim] */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    /* causal: the last Q tile sees the most K/V tiles, so it goes first and the short ones fill in */
    const int i = causal ? (int)gridDim.x - 1 - (int)blockIdx.x : (int)blockIdx.x;
    const size_t bh = blockIdx.y, head = bh * N * HeadDim;
    const int q0 = i * Br, row0 = warp * ROWS_PER_WARP; /* the tile's first query; this warp's first row in it */
    const int q_w = q0 + row0;                          /* this warp's first query */
    const float scale_log2 = scale * LOG2E;
    /* K/V tiles this Q tile sees: all, or (causal) up to the one holding its last query */
    const int Tc = CEIL_DIV(N, Bc);
    const int n_tiles = causal ? min(Tc, (min(q0 + Br, N) - 1) / Bc + 1) : Tc;
    /* keys this warp sees: none if its rows are all past N; with a causal mask none after its last query */
    const int keys_end = q_w >= N ? 0 : causal ? min(N, q_w + ROWS_PER_WARP) : N;

    /* This lane's ldmatrix addresses (32-bit shared), computed once, as in stage 9: every other
     * fragment is a compile-time swizzle_step from one of them. dO_i lies a fixed distance after
     * Q_i and V_j after K_j, so one address serves both tiles of a pair; the K/V buffer in use adds
     * b * KV_BUF once per step and the sub-tile its rows once per sub-tile. */
    const unsigned smem_s = (unsigned)__cvta_generic_to_shared(smem);
    constexpr unsigned dO_OFF = Smem::dO_i - Smem::Q_i, V_OFF = Smem::V_j - Smem::K_j;
    constexpr unsigned KV_BUF = 2 * Bc * HeadDim; /* bytes of one K_j (or V_j) buffer */
    /* S, dP: Q_i (dO_i) rows row0.. as A fragments; K_j (V_j) rows as B fragments (the tile holds B^T) */
    const unsigned Q_A = swizzle_addr<HeadDim>(smem_s + Smem::Q_i, row0 + a_order_row(lane), a_order_chunk(lane));
    const unsigned K_B = swizzle_addr<HeadDim>(smem_s + Smem::K_j, b_order_row(lane), b_order_chunk(lane));
    /* dQ_i += dS K_j: K_j's rows are the k of this product, read .trans as B fragments */
    const unsigned K_C = swizzle_addr<HeadDim>(smem_s + Smem::K_j, a_order_row(lane), a_order_chunk(lane));

    /* Q_i and dO_i once, K_0 and V_0 into buffer 0: one cp.async group. Rows past N read as zeros:
     * a query past N has Q = dO = 0 and L = D = 0 below, so P = 1 but dP = 0 and dS = 0, and its dQ
     * row is never written; a key past N is masked. K_j and V_j are loaded on every step, so each
     * thread's addresses for them are worked out once (swizzled_tile_loader). */
    const swizzled_tile_loader<T, HeadDim, Bc, THREADS> kv_loader;
    load_tile_swizzled<T, HeadDim, Br, THREADS>(Q_i, Q + head, q0, N);
    load_tile_swizzled<T, HeadDim, Br, THREADS>(dO_i, dO + head, q0, N);
    kv_loader.load(K_buf, K + head, 0, N);
    kv_loader.load(V_buf, V + head, 0, N);
    cp_async_commit();

    /* L_i (log2 units) and D_i of the Q tile, once: in shared memory rather than 4 M_TILES registers
     * per thread, which at d = 64 on sm_80 were the difference between spilling and not. Rows past N
     * get L = D = 0. (Visible to every warp after the first barrier below.) */
    float *L_s = (float *)(smem + Smem::L_i), *D_s = (float *)(smem + Smem::D_i);
    for (int r = tid; r < Br; r += THREADS) {
        L_s[r] = q0 + r < N ? L2[bh * N + q0 + r] : 0.f;
        D_s[r] = q0 + r < N ? Dsum[bh * N + q0 + r] : 0.f;
    }
    float dQ_acc[M_TILES][DT][4] = {};

    /* C[mt][..] += A B^T over the head dim for this warp's rows and a sub-tile of Bs keys: A rows
     * from A_at (Q_i or dO_i), B^T rows from B_at (K_j or V_j). Each B fragment serves M_TILES mma
     * pairs. */
    auto product = [&](float C[M_TILES][KT][4], unsigned A_at, unsigned B_at) {
#pragma unroll
        for (int k = 0; k < HeadDim; k += 16) {
            uint32_t Af[M_TILES][4];
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++) ldmatrix_x4_at(Af[mt], swizzle_step<HeadDim>(A_at, 16 * mt, k / 8));
#pragma unroll
            for (int kb = 0; kb < Bs / 16; kb++) {
                uint32_t Bf[4]; /* Bf[0..1] keys 16 kb .. +7, Bf[2..3] keys 16 kb + 8 .. +15 */
                ldmatrix_x4_at(Bf, swizzle_step<HeadDim>(B_at, 16 * kb, k / 8));
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++) {
                    M::mma(C[mt][2 * kb], Af[mt], &Bf[0]);
                    M::mma(C[mt][2 * kb + 1], Af[mt], &Bf[2]);
                }
            }
        }
    };

    for (int j = 0, b = 0; j < n_tiles; j++, b ^= 1) {
        cp_async_wait<0>();
        __syncthreads(); /* K_j, V_j in buffer b (and Q_i, dO_i); every warp is done with step j-1, so
                          * buffer b^1 is free */
        if (j + 1 < n_tiles) { /* tile j+1 copies while tile j computes */
            kv_loader.load(K_buf + (b ^ 1) * Bc * HeadDim, K + head, (j + 1) * Bc, N);
            kv_loader.load(V_buf + (b ^ 1) * Bc * HeadDim, V + head, (j + 1) * Bc, N);
        }
        cp_async_commit();

        /* the tile in sub-tiles of Bs keys, each start to finish (only one sub-tile's S and dP are
         * live at a time); not unrolled, so the compiler cannot overlap two and run out of registers */
#pragma unroll 1
        for (int sb = 0; sb < Bc; sb += Bs) {
            const int key0 = j * Bc + sb; /* this sub-tile's first key */
            if (key0 >= keys_end) break;  /* this warp's queries see none of the rest (same for its lanes) */
            const unsigned K_s = K_B + b * KV_BUF + sb * 2 * HeadDim; /* this sub-tile's rows of buffer b */

            /* S = Q_i K_j^T and dP = dO_i V_j^T (raw: the scale is folded into the exponential) */
            float S[M_TILES][KT][4] = {}, dP[M_TILES][KT][4] = {};
            product(S, Q_A, K_s);
            product(dP, Q_A + dO_OFF, K_s + V_OFF);

            /* Masks, only where needed: S = -inf (so P = 0) where the key is past N or, causal, after
             * the query. C layout: S[mt][nt][c] is query q_w + 16 mt + g + 8 (c >> 1), key
             * key0 + 8 nt + 2t + (c & 1). Each of this lane's rows gets, once, the first key offset
             * 8 nt + (c & 1) it drops; then a score costs one compare with a constant. */
            if (key0 + Bs > N || (causal && key0 + Bs - 1 > q_w)) {
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const int query = q_w + 16 * mt + 8 * h + g;
                        const int drop = (causal ? min(N, query + 1) : N) - (key0 + 2 * t);
#pragma unroll
                        for (int nt = 0; nt < KT; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++)
                                if (8 * nt + e >= drop) S[mt][nt][2 * h + e] = -INFINITY;
                    }
            }
            /* dS = P (dP - D), P = exp2(scale log2e S - L log2e), into S's registers; each of this
             * lane's rows reads its L and D once. A masked score gives exp2(-inf) = 0 and dS = 0 (L is
             * finite on every row: a row past N has L = 0). */
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = row0 + 16 * mt + 8 * h + g;
                    const float L_r = L_s[r], D_r = D_s[r];
#pragma unroll
                    for (int nt = 0; nt < KT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int c = 2 * h + e;
                            S[mt][nt][c] = exp2_approx(fmaf(S[mt][nt][c], scale_log2, -L_r)) * (dP[mt][nt][c] - D_r);
                        }
                }

            /* dQ_i += dS K_j, one k16 step of keys at a time: dS packed into 16-bit A fragments just
             * before its step (two n8 tiles' C layout is one k16 tile's A layout); each K fragment
             * serves this warp's M_TILES row tiles */
            const unsigned Kt_s = K_C + b * KV_BUF + sb * 2 * HeadDim;
#pragma unroll
            for (int kb = 0; kb < Bs / 16; kb++) {
                uint32_t dSa[M_TILES][4];
#pragma unroll
                for (int mt = 0; mt < M_TILES; mt++) pack_A<T>(dSa[mt], S[mt][2 * kb], S[mt][2 * kb + 1]);
#pragma unroll
                for (int n = 0; n < HeadDim; n += 16) {
                    uint32_t Kf[4]; /* Kf[0..1] columns n .. n+7, Kf[2..3] columns n+8 .. n+15 */
                    ldmatrix_x4_trans_at(Kf, swizzle_step<HeadDim>(Kt_s, 16 * kb, n / 8));
#pragma unroll
                    for (int mt = 0; mt < M_TILES; mt++) {
                        M::mma(dQ_acc[mt][n / 8], dSa[mt], &Kf[0]);
                        M::mma(dQ_acc[mt][n / 8 + 1], dSa[mt], &Kf[2]);
                    }
                }
            }
        }
    }

    /* dQ_i = scale dS K, in the input dtype. It goes through this warp's own rows of Q_i in shared
     * memory (no other warp reads them), then out in 16-byte stores along each row, as stage 9's O. */
    __syncwarp(); /* every lane of this warp is past its last ldmatrix of these rows */
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row0 + 16 * mt + 8 * h + g;
#pragma unroll
            for (int nt = 0; nt < DT; nt++)
                *(uint32_t *)&Q_i[swizzle<HeadDim>(r, nt) + 2 * t] =
                    M::pack(scale * dQ_acc[mt][nt][2 * h], scale * dQ_acc[mt][nt][2 * h + 1]);
        }
    __syncwarp(); /* this warp's dQ rows in shared memory before its lanes copy them out */
    constexpr int CHUNKS = HeadDim / 8;
    T *dQ_w = dQ + head + (size_t)q_w * HeadDim; /* this warp's first row */
#pragma unroll
    for (int c = lane; c < ROWS_PER_WARP * CHUNKS; c += WARP_SIZE) {
        const int r = c / CHUNKS, chunk = c % CHUNKS;
        if (q_w + r < N)
            *(uint4 *)&dQ_w[r * HeadDim + chunk * 8] = *(const uint4 *)&Q_i[swizzle<HeadDim>(row0 + r, chunk)];
    }
}

/* dQ = scale * the fp32 accumulator, in the input dtype, 8 elements (two float4 in, 16 bytes out)
 * per thread and step; n8 = elements / 8 (d is a multiple of 8). */
template <typename T>
__global__ void stage10_convert_kernel(const float *__restrict__ dQ_acc, T *__restrict__ dQ, size_t n8, float scale)
{
    typedef mma16<T> M;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n8; k += (size_t)gridDim.x * blockDim.x) {
        const float4 a = ((const float4 *)dQ_acc)[2 * k], b = ((const float4 *)dQ_acc)[2 * k + 1];
        ((uint4 *)dQ)[k] = make_uint4(M::pack(scale * a.x, scale * a.y), M::pack(scale * a.z, scale * a.w),
                                      M::pack(scale * b.x, scale * b.y), M::pack(scale * b.z, scale * b.w));
    }
}

/* --deterministic: dQ = scale * the sum of the S splits' fp32 accumulators, in order of s, over the
 * splits that hold the row: split s's first K/V tile is j = s, and under a causal mask it (and so
 * every later tile of the split) skips the Q tiles i < (s Bc) / Br: Q tile i is held by splits
 * s < ceil((i + 1) Br / Bc). The rest of an accumulator is never written, so never read. */
template <typename T, class Cfg>
__global__ void stage10_convert_splits_kernel(const float *__restrict__ dQ_acc, T *__restrict__ dQ, size_t n8,
                                              float scale, int S, int N, int causal)
{
    typedef mma16<T> M;
    constexpr int HeadDim = Cfg::HeadDim, Br = Cfg::Br, Bc = Cfg::Bc;
    const size_t split = 8 * n8; /* elements of one accumulator */
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n8; k += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)((8 * k / HeadDim) % N) / Br; /* the row's Q tile */
        const int held = causal ? min(S, CEIL_DIV((i + 1) * Br, Bc)) : S;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
        for (int s = 0; s < held; s++) {
            const float4 *acc = (const float4 *)(dQ_acc + s * split);
            const float4 x = acc[2 * k], y = acc[2 * k + 1];
            a.x += x.x, a.y += x.y, a.z += x.z, a.w += x.w;
            b.x += y.x, b.y += y.y, b.z += y.z, b.w += y.w;
        }
        ((uint4 *)dQ)[k] = make_uint4(M::pack(scale * a.x, scale * a.y), M::pack(scale * a.z, scale * a.w),
                                      M::pack(scale * b.x, scale * b.y), M::pack(scale * b.z, scale * b.w));
    }
}

/* ---- launcher ---- */

/* How --deterministic computes dQ with dK/dV tiles Cfg (the rule): by the ordered splits where a
 * K/V tile is 128 keys (d <= 128), by the separate dQ kernel (stage10_dq_kernel, parallel over Q
 * tiles) where it is 64 (d = 256). With 64-key tiles each key adds twice the dQ bytes per product,
 * and there the splits cost more over the atomic path than the dQ kernel's two extra products
 * (notes/10_backward.md). DQ_KERNEL_EVERY_D takes the dQ kernel at every d: the stage's own
 * descriptor leaves it false, bench/ablations/10_dq_kernel.cu sets it. */
template <class Cfg, bool DQ_KERNEL_EVERY_D>
constexpr bool dq_kernel_for(int deterministic)
{
    return deterministic && (DQ_KERNEL_EVERY_D || Cfg::Bc < 128);
}

/* --deterministic's splits of a head's K/V tiles (the rule): one wave of dK/dV blocks,
 *   S = min(Tc, max(1, floor(resident blocks / (B * H)))),
 * resident blocks = SMs x the blocks of the kernel an SM holds (the occupancy API; one on an H100
 * or H200 at every d). Every block of the grid then runs from the start to the end, and S
 * accumulators of dQ (fp32, S x B x H x N x d) are what the order costs in memory. Where B x H is
 * over half the resident blocks, S = 1: each block sweeps all of its head's tiles. */
template <class Cfg>
int dq_splits(const struct shape *sh, char *why, size_t n)
{
    static int slots = 0;
    if (!slots) {
        const int r = resident_blocks_of(stage10_dkdv_kernel<__half, Cfg, true>, Cfg::KV_WARPS * WARP_SIZE,
                                         Cfg::smem_bytes, Cfg::HeadDim, why, n);
        if (r < 0) return -1;
        slots = r;
    }
    const long long bh = (long long)sh->B * sh->H, Tc = CEIL_DIV(sh->N, Cfg::Bc);
    return (int)std::min(Tc, std::max(1LL, slots / bh));
}

/* The fp32 dQ accumulators a call takes, first in the workspace (workspace_bytes): one per split
 * with --deterministic's splits, else one (the atomic path's; the dQ kernel's call leaves it
 * unused). -1 where the device cannot be asked. */
template <class Cfg, bool DQ_KERNEL_EVERY_D>
int dq_accumulators(const struct attn_args *a, char *why, size_t n)
{
    return a->deterministic && !dq_kernel_for<Cfg, DQ_KERNEL_EVERY_D>(1) ? dq_splits<Cfg>(&a->sh, why, n) : 1;
}

/* The dK/dV kernel with configuration Cfg, then: without --deterministic the convert kernel; with
 * it the splits' convert kernel, or the dQ kernel with Dq where dq_kernel_for says so. */
template <typename T, class Cfg, class Dq, bool DQ_KERNEL_EVERY_D>
int launch(const struct attn_args *a, char *why, size_t n)
{
    constexpr int HeadDim = Cfg::HeadDim;
    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    if (bh > 65535) {
        snprintf(why, n, "batch * heads = %lld is more than a grid's y dimension holds (65535)", bh);
        return ATTN_UNSUPPORTED;
    }
    const size_t kv_smem = Cfg::smem_bytes, dq_smem = Dq::smem_bytes;
    /* --deterministic: the splits (stage10_dkdv_kernel<..., true>), or the dQ kernel where chosen */
    const bool dq_kernel = dq_kernel_for<Cfg, DQ_KERNEL_EVERY_D>(a->deterministic);
    const bool splits = a->deterministic && !dq_kernel;
    if (int rc = splits ? smem_optin(stage10_dkdv_kernel<T, Cfg, true>, kv_smem, HeadDim, why, n)
                        : smem_optin(stage10_dkdv_kernel<T, Cfg, false>, kv_smem, HeadDim, why, n))
        return rc;
    if (dq_kernel)
        if (int rc = smem_optin(stage10_dq_kernel<T, Dq>, dq_smem, HeadDim, why, n)) return rc;
    const int S = dq_accumulators<Cfg, DQ_KERNEL_EVERY_D>(a, why, n);
    if (S < 0) return ATTN_CUDA_ERROR;

    const size_t rows = shape_rows(sh), elems = shape_elems(sh);
    /* the workspace (workspace_bytes): S fp32 dQ accumulators first (16-byte aligned), then D, L */
    float *dQ_acc = (float *)a->work, *Dsum = dQ_acc + S * elems, *L2 = Dsum + rows;
    const T *Q = (const T *)a->Q, *K = (const T *)a->K, *V = (const T *)a->V, *O = (const T *)a->O;
    const T *dO = (const T *)a->dO;

    stage10_preprocess_kernel<T, HeadDim><<<(unsigned)CEIL_DIV(rows, PRE_THREADS / (HeadDim / 8)), PRE_THREADS>>>(
        O, dO, a->L, Dsum, L2, a->deterministic ? NULL : dQ_acc, rows);
    CUDA_TRY(cudaGetLastError());
    if (splits)
        stage10_dkdv_kernel<T, Cfg, true><<<dim3(S, (unsigned)bh), Cfg::KV_WARPS * WARP_SIZE, kv_smem>>>(
            Q, K, V, dO, L2, Dsum, (T *)a->dK, (T *)a->dV, dQ_acc, sh->N, sh->causal, sh->scale, 1);
    else
        stage10_dkdv_kernel<T, Cfg, false><<<dim3(CEIL_DIV(sh->N, Cfg::Bc), (unsigned)bh), Cfg::KV_WARPS * WARP_SIZE,
                                             kv_smem>>>(Q, K, V, dO, L2, Dsum, (T *)a->dK, (T *)a->dV, dQ_acc, sh->N,
                                                        sh->causal, sh->scale, !a->deterministic);
    CUDA_TRY(cudaGetLastError());
    const unsigned convert_blocks = (unsigned)std::min<size_t>(CEIL_DIV(elems / 8, 256), 65535);
    if (splits) {
        stage10_convert_splits_kernel<T, Cfg><<<convert_blocks, 256>>>(dQ_acc, (T *)a->dQ, elems / 8, sh->scale, S,
                                                                       sh->N, sh->causal);
    } else if (dq_kernel) {
        stage10_dq_kernel<T, Dq><<<dim3(CEIL_DIV(sh->N, Dq::Br), (unsigned)bh), Dq::THREADS, dq_smem>>>(
            Q, K, V, dO, L2, Dsum, (T *)a->dQ, sh->N, sh->causal, sh->scale);
    } else {
        stage10_convert_kernel<T><<<convert_blocks, 256>>>(dQ_acc, (T *)a->dQ, elems / 8, sh->scale);
    }
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* The first configuration of a list, and the shared memory of its smallest. */
template <class First, class... Rest>
constexpr First first_of(config_list<First, Rest...>)
{
    return First{};
}
template <class... Configs>
constexpr size_t smallest_smem(config_list<Configs...>)
{
    return std::min({Configs::smem_bytes...});
}

/* Calls f(Cfg{}, Dq{}) with the first dK/dV configuration of head dim HeadDim that fits `limit`
 * bytes and, with --deterministic, the first dQ configuration that does (without it, Dq is the
 * first of the list, and unused). Up to d = 128 the dQ kernel has tiles wherever the dK/dV kernel
 * has (the static_assert): --deterministic runs wherever the backward runs. At d = 256 its
 * smallest tiles take 161 KiB, which an A100 (163 KiB) has, beside the dK/dV kernel's 136.5; a
 * limit between the two refuses --deterministic alone, with one line that says so. */
template <int HeadDim, class F>
int with_tiles_d(int deterministic, size_t limit, char *why, size_t n, F &&f)
{
    typedef typename kv_cfg<HeadDim>::list KV;
    typedef typename dq_cfg<HeadDim>::list DQ;
    static_assert(HeadDim == 256 || smallest_smem(DQ()) <= smallest_smem(KV()),
                  "the dQ kernel's smallest tiles fit wherever the dK/dV kernel's smallest do");
    return first_fit(KV(), limit, HeadDim, why, n, [&](auto cfg) {
        if (!deterministic) return f(cfg, first_of(DQ()));
        if (limit < smallest_smem(DQ())) {
            snprintf(why, n, "d=%d: --deterministic needs %.1f KiB of shared memory per block, this device allows %zu "
                     "KiB%s; without it the backward fits", HeadDim, smallest_smem(DQ()) / 1024.0, limit / 1024,
                     smem_cap_words(limit));
            return (int)ATTN_UNSUPPORTED;
        }
        return first_fit(DQ(), limit, HeadDim, why, n, [&](auto dq) { return f(cfg, dq); });
    });
}
template <class F>
int with_tiles(int d, int deterministic, size_t limit, char *why, size_t n, F &&f)
{
    switch (d) {
    case 32: return with_tiles_d<32>(deterministic, limit, why, n, f);
    case 64: return with_tiles_d<64>(deterministic, limit, why, n, f);
    case 128: return with_tiles_d<128>(deterministic, limit, why, n, f);
    case 256: return with_tiles_d<256>(deterministic, limit, why, n, f);
    }
    snprintf(why, n, "supports head dim 32, 64, 128 or 256 (got d=%d)", d);
    return ATTN_UNSUPPORTED;
}

template <typename T, bool DQ_KERNEL_EVERY_D>
int dispatch(const struct attn_args *a, char *why, size_t n)
{
    return with_tiles(a->sh.d, a->deterministic, gpu_smem_limit(), why, n, [&](auto cfg, auto dq) {
        return launch<T, decltype(cfg), decltype(dq), DQ_KERNEL_EVERY_D>(a, why, n);
    });
}

/* The workspace: the fp32 dQ accumulator (with --deterministic's splits, one per split:
 * dq_splits), then D and L * log2(e) (fp32, one each per row). Sized for the stage's rule, which
 * never takes fewer accumulators than the dQ kernel at every d (one), so the ablation fits too. */
size_t workspace_bytes(const struct attn_args *a)
{
    const struct shape *sh = &a->sh;
    char why[256];
    const int S = with_tiles(sh->d, a->deterministic, gpu_smem_limit(), why, sizeof why, [&](auto cfg, auto) {
        return dq_accumulators<decltype(cfg), false>(a, why, sizeof why);
    });
    return 2 * shape_rows(sh) * sizeof(float) + (size_t)std::max(S, 1) * shape_elems(sh) * sizeof(float);
}

/* The backward's tiles where a block may have `limit` bytes: the dK/dV kernel's, and where
 * --deterministic runs the dQ kernel its tiles (the summary names them). */
template <bool DQ_KERNEL_EVERY_D>
int backward_tiles(const struct attn_args *a, size_t limit, struct tile_config *c)
{
    return with_tiles(a->sh.d, a->deterministic, limit, c->text, sizeof c->text, [&](auto cfg, auto dq) {
        typedef decltype(cfg) Cfg;
        typedef decltype(dq) Dq;
        const bool dq_kernel = dq_kernel_for<Cfg, DQ_KERNEL_EVERY_D>(a->deterministic);
        char dq_words[64] = "";
        if (dq_kernel) snprintf(dq_words, sizeof dq_words, "; dQ Br=%d Bc=%d, %d warps", Dq::Br, Dq::Bc, Dq::WARPS);
        else if (a->deterministic) snprintf(dq_words, sizeof dq_words, "; dQ by ordered splits");
        const size_t bytes = dq_kernel ? std::max(Dq::smem_bytes, Cfg::smem_bytes) : Cfg::smem_bytes;
        return tiles_found(c, Cfg::Br, Cfg::Bc, bytes, "dK/dV Br=%d Bc=%d, %d warps%s", Cfg::Br, Cfg::Bc,
                           Cfg::KV_WARPS, dq_words);
    });
}

template <bool DQ_KERNEL_EVERY_D>
int backward(const struct attn_args *a, char *why, size_t n)
{
    if (a->work == NULL) {
        snprintf(why, n, "needs its workspace (D and the fp32 dQ accumulator) and got none");
        return ATTN_UNSUPPORTED;
    }
    if (a->dtype == DT_F16) return dispatch<__half, DQ_KERNEL_EVERY_D>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch<__nv_bfloat16, DQ_KERNEL_EVERY_D>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

} // namespace

/* The forward is stage 9's: O and L for the backward come from it. */
extern "C" const struct stage stage9_desc;
static int forward(const struct attn_args *a, char *why, size_t n) { return stage9_desc.forward(a, why, n); }
template <bool DQ_KERNEL_EVERY_D>
static int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    return backward ? backward_tiles<DQ_KERNEL_EVERY_D>(a, limit, c) : stage9_desc.tiles(a, 0, limit, c);
}

extern "C" const struct stage stage10_desc = {
    .name = "stage10",
    .idea = "FA-2 backward: P recomputed from L, parallel over K/V tiles, dQ accumulated in fp32",
    .device = ON_GPU,
    .forward = forward,
    .backward = backward<false>,
    .dims = {32, 64, 128, 256},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = workspace_bytes,
    .openmp = 0,
    .hbm_traffic = NULL,
    .measures_backward = 1,
    .arch_sm = 0,
    .tiles = tiles_for<false>,
};
