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
 *   With --deterministic the dK/dV kernel skips dQ and stage10_dq_kernel computes it instead,
 *   parallel over Q tiles with dQ_i in registers: no atomics, the same bits on every run, at the
 *   price of recomputing S and dP once more.
 * Why this shape: dK_j and dV_j sum over every query, dQ_i over every key; a block can own one of
 *   the two sums and must share the other. FA-2 owns dK, dV (two accumulators on chip) and adds
 *   dQ into HBM. P is recomputed from Q, K and L rather than stored: storing it is N^2 per head,
 *   the very memory FlashAttention exists to avoid.
 * The engineering is stage 9's (swizzled tiles and their ldmatrix fragments from
 *   common/cuda/swizzle.cuh, cp.async, exp2 with the scale folded in), plus: the next Q_i, dO_i,
 *   L_i, D_i are copied in while this one computes (double buffer); each step runs in three
 *   phases with a warp layout of its own, P^T and dS^T passing through shared memory (FA-2's
 *   arrangement: it makes each ldmatrix feed more mma); a block owns 128 keys so every dQ row gets
 *   half as many atomic adds as with 64; each add is a float2 (sm_90: one atomic for two columns).
 * Measured on H200: see notes/10_backward.md.
 * Run: ./stage10 --seqlen 4096 --dim 64 --causal  (add --deterministic for the atomic-free dQ)
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
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* The dK/dV kernel: KV_WARPS warps, a K/V tile of Bc keys, Q swept in tiles of Br queries. Each
 * step has three phases, and the warps split the work differently in each (FA-2's arrangement):
 *   A. S^T = K_j Q_i^T and dP^T = V_j dO_i^T, then P^T and dS^T: a warp takes KEYS_PER_WARP_A keys
 *      x QUERIES_PER_WARP_A queries;
 *   B. dV_j += P^T dO_i, dK_j += dS^T Q_i: a warp takes 32 keys x d/2 columns (its accumulators);
 *   C. dQ_i += dS K_j: a warp takes 32 queries x COLS_PER_WARP_C columns.
 * The tiles are FA-2's for the sm80 backward: Br = 64 queries at d = 128, 128 at d = 64, and
 * Bc = 128 keys at both. KEYS_PER_WARP_A and UNROLL_A are the choices measured fastest without
 * spilling (notes/10_backward.md). */
constexpr int KV_WARPS = 8, KV_THREADS = KV_WARPS * WARP_SIZE;
template <int HeadDim>
struct kv_cfg;
/* UNROLL_A: how many k16 steps of phase A's loop over the head dim are unrolled */
template <>
struct kv_cfg<64> { static constexpr int Br = 128, Bc = 128, KEYS_PER_WARP_A = 64, UNROLL_A = 4; };
template <>
struct kv_cfg<128> { static constexpr int Br = 64, Bc = 128, KEYS_PER_WARP_A = 32, UNROLL_A = 4; };

/* The dQ kernel (--deterministic): DQ_WARPS warps of 16 queries (a Q tile of Br), sweeping K/V in
 * tiles of Bc keys. */
constexpr int DQ_WARPS = 4, DQ_THREADS = DQ_WARPS * WARP_SIZE;
struct dq_cfg { static constexpr int Br = DQ_WARPS * 16, Bc = 64; };

/* Shared memory of the dK/dV kernel: K_j, V_j [Bc][HeadDim]; Q_i, dO_i [2][Br][HeadDim]
 * (double-buffered); P^T, dS^T [Bc][Br] (16-bit); L_i, D_i [2][Br]. Tiles are swizzled
 * (common/cuda/swizzle.cuh). */
template <int HeadDim>
struct kv_smem_layout {
    static constexpr int Br = kv_cfg<HeadDim>::Br, Bc = kv_cfg<HeadDim>::Bc;
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
/* ... and of the dQ kernel: Q_i, dO_i [Br][HeadDim], K_j, V_j [Bc][HeadDim]. */
template <int HeadDim>
struct dq_smem_layout {
    static constexpr int Br = dq_cfg::Br, Bc = dq_cfg::Bc;
    static constexpr size_t Q_i = 0;
    static constexpr size_t dO_i = Q_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t K_j = dO_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t V_j = K_j + 2 * (size_t)Bc * HeadDim;
    static constexpr size_t bytes = V_j + 2 * (size_t)Bc * HeadDim;
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

/* dK_j, dV_j for one K/V tile (and, unless deterministic, this tile's share of dQ).
 * Why three phases: a first version gave each warp 16 keys against the whole Q tile, all in
 * registers (P^T and dS^T never left them), but then every Q or dO fragment a warp loads feeds only
 * two mma, and shared-memory reads were the limit (1.74 mma per ldmatrix.x4 at d = 128). Writing
 * P^T and dS^T to shared memory once lets each phase pick the warp layout that reuses its loads:
 * per step and warp, 144 ldmatrix.x4 feed 320 mma at either d (2.2). */
template <typename T, int HeadDim>
__global__ void __launch_bounds__(KV_THREADS)
stage10_dkdv_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                   const T *__restrict__ dO, const float *__restrict__ L2, const float *__restrict__ Dsum,
                   T *__restrict__ dK, T *__restrict__ dV, float *__restrict__ dQ_acc, int N, int causal,
                   float scale, int with_dq)
{
    typedef kv_smem_layout<HeadDim> Smem;
    typedef mma16<T> M;
    constexpr int Br = Smem::Br, Bc = Smem::Bc; /* queries per Q tile, keys per K/V tile */
    /* phase A: keys and queries per warp, and the m16 key tiles and n8 query tiles they make */
    constexpr int KEYS_PER_WARP_A = kv_cfg<HeadDim>::KEYS_PER_WARP_A;
    constexpr int QUERIES_PER_WARP_A = Bc * Br / (KV_WARPS * KEYS_PER_WARP_A);
    constexpr int KEY_TILES_A = KEYS_PER_WARP_A / 16, QUERY_TILES_A = QUERIES_PER_WARP_A / 8;
    /* phase C: the Br queries in QUERY_GROUPS_C groups of 32; the KV_WARPS / QUERY_GROUPS_C warps
     * on one group split the d columns, COLS_PER_WARP_C each */
    constexpr int QUERY_GROUPS_C = Br / 32, COLS_PER_WARP_C = HeadDim * QUERY_GROUPS_C / 8;
    static_assert(KV_WARPS == 8 && Bc == 128 && QUERIES_PER_WARP_A % 16 == 0 && KEYS_PER_WARP_A % 16 == 0 &&
                      COLS_PER_WARP_C % 16 == 0,
                  "each phase's warp layout covers the tiles exactly: A (Bc / KEYS_PER_WARP_A) x (Br / "
                  "QUERIES_PER_WARP_A), B 4 x 2, C QUERY_GROUPS_C x (HeadDim / COLS_PER_WARP_C)");
    extern __shared__ __align__(128) unsigned char smem[];
    /* the tiles hold T; ldmatrix only moves 16-bit patterns, so they are addressed as __half */
    __half *K_j = (__half *)(smem + Smem::K_j), *V_j = (__half *)(smem + Smem::V_j);
    __half *Q_buf = (__half *)(smem + Smem::Q_i), *dO_buf = (__half *)(smem + Smem::dO_i); /* [2][Br][HeadDim] */
    __half *PT_s = (__half *)(smem + Smem::PT), *dST_s = (__half *)(smem + Smem::dST);     /* [Bc][Br] */
    float *L_buf = (float *)(smem + Smem::L_i), *D_buf = (float *)(smem + Smem::D_i);     /* [2][Br] */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int j = blockIdx.x;                      /* this block's K/V tile */
    const size_t bh = blockIdx.y, head = bh * N * HeadDim;
    /* this warp's part in phase A (KEYS_PER_WARP_A keys x QUERIES_PER_WARP_A queries), B (32 keys x
     * d/2 columns), C (32 queries x COLS_PER_WARP_C columns): its first key, query or column */
    const int keyA = (warp % (Bc / KEYS_PER_WARP_A)) * KEYS_PER_WARP_A;
    const int qA = (warp / (Bc / KEYS_PER_WARP_A)) * QUERIES_PER_WARP_A;
    const int keyB = (warp % 4) * 32, colB = (warp / 4) * (HeadDim / 2);
    const int qC = (warp % QUERY_GROUPS_C) * 32, colC = (warp / QUERY_GROUPS_C) * COLS_PER_WARP_C;
    const float scale_log2 = scale * LOG2E;
    const int Tr = CEIL_DIV(N, Br);
    /* causal: Q tiles wholly above the diagonal (every query before every key of K_j) see none of it */
    const int i_first = causal ? (j * Bc) / Br : 0;

    /* Q tile i into buffer b: Q_i and dO_i rows, and L_i, D_i, all by cp.async. Rows past N read as
     * zeros: Q = dO = 0 and L = D = 0 there give P = 1 but dP = 0, so dS = 0, and dO = 0 adds
     * nothing to dV: such a query contributes nothing, and its dQ row is never written. */
    auto load_q_tile = [&](int i, int b) {
        load_tile_swizzled<T, HeadDim, Br, KV_THREADS>(Q_buf + b * Br * HeadDim, Q + head, i * Br, N);
        load_tile_swizzled<T, HeadDim, Br, KV_THREADS>(dO_buf + b * Br * HeadDim, dO + head, i * Br, N);
        if (tid < 2 * Br) {
            const int r = tid % Br, q = i * Br + r;
            const float *src = (tid < Br ? L2 : Dsum) + bh * N + (q < N ? q : 0);
            cp_async_4_zfill((tid < Br ? L_buf : D_buf) + b * Br + r, src, q < N);
        }
    };

    load_tile_swizzled<T, HeadDim, Bc, KV_THREADS>(K_j, K + head, j * Bc, N);
    load_tile_swizzled<T, HeadDim, Bc, KV_THREADS>(V_j, V + head, j * Bc, N);
    load_q_tile(i_first, 0);
    cp_async_commit();

    float dK_acc[2][HeadDim / 16][4] = {}, dV_acc[2][HeadDim / 16][4] = {}; /* phase B's 32 keys x d/2 */

    for (int i = i_first, b = 0; i < Tr; i++, b ^= 1) {
        cp_async_wait<0>();
        __syncthreads(); /* tile i in buffer b; every warp is done with step i-1 (buffer b^1, P^T, dS^T free) */
        if (i + 1 < Tr) load_q_tile(i + 1, b ^ 1);
        cp_async_commit();
        const __half *Q_i = Q_buf + b * Br * HeadDim, *dO_i = dO_buf + b * Br * HeadDim;
        const float *L_i = L_buf + b * Br, *D_i = D_buf + b * Br;

        /* A. S^T = K_j Q_i^T, then dP^T = V_j dO_i^T, for this warp's KEYS_PER_WARP_A keys x
         * QUERIES_PER_WARP_A queries (one product at a time: their fragments need not be live
         * together) */
        float ST[KEY_TILES_A][QUERY_TILES_A][4] = {}, dPT[KEY_TILES_A][QUERY_TILES_A][4] = {};
        auto product = [&](float C[KEY_TILES_A][QUERY_TILES_A][4], const __half *A_tile, const __half *B_tile) {
            constexpr int UNROLL_A = kv_cfg<HeadDim>::UNROLL_A;
#pragma unroll UNROLL_A
            for (int k = 0; k < HeadDim; k += 16) {
                uint32_t Af[KEY_TILES_A][4];
#pragma unroll
                for (int m = 0; m < KEY_TILES_A; m++) frag_A<HeadDim>(Af[m], A_tile, keyA + 16 * m, k);
#pragma unroll
                for (int qb = 0; qb < QUERY_TILES_A / 2; qb++) {
                    uint32_t Bf[4];
                    frag_Bt<HeadDim>(Bf, B_tile, qA + 16 * qb, k);
#pragma unroll
                    for (int m = 0; m < KEY_TILES_A; m++) {
                        M::mma(C[m][2 * qb], Af[m], &Bf[0]);
                        M::mma(C[m][2 * qb + 1], Af[m], &Bf[2]);
                    }
                }
            }
        };
        product(ST, K_j, Q_i);
        product(dPT, V_j, dO_i);
        /* P^T = exp2(scale log2e S^T - L log2e), 0 where masked (key past N; causal: key after
         * query), and dS^T = P^T (dP^T - D), both to shared memory in 16-bit. C layout: ST[m][nt][c]
         * is key keyA + 16 m + g + 8 (c >> 1), query qA + 8 nt + 2t + (c & 1). */
        const bool need_mask = (j + 1) * Bc > N || (causal && (j + 1) * Bc - 1 > i * Br);
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
                    const int key = j * Bc + keyA + 16 * m + g + 8 * (c >> 1), q = i * Br + ql + (c & 1);
                    p[c] = exp2_approx(fmaf(ST[m][nt][c], scale_log2, -((c & 1) ? Lq.y : Lq.x)));
                    if (need_mask && (key >= N || (causal && key > q))) p[c] = 0.f;
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

        /* B. dV += P^T dO_i, dK += dS^T Q_i for 32 keys x d/2 columns, over the Br queries */
#pragma unroll
        for (int qk = 0; qk < Br; qk += 16) {
            uint32_t Pa[2][4], dSa[2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                frag_A<Br>(Pa[m], PT_s, keyB + 16 * m, qk);
                frag_A<Br>(dSa[m], dST_s, keyB + 16 * m, qk);
            }
#pragma unroll
            for (int n = 0; n < HeadDim / 2; n += 16) {
                uint32_t dOf[4], Qf[4];
                frag_B<HeadDim>(dOf, dO_i, qk, colB + n);
                frag_B<HeadDim>(Qf, Q_i, qk, colB + n);
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
            for (int m = 0; m < 2; m++) frag_At<Br>(dSa[m], dST_s, kb, qC + 16 * m);
#pragma unroll
            for (int n = 0; n < COLS_PER_WARP_C; n += 16) {
                uint32_t Kf[4];
                frag_B<HeadDim>(Kf, K_j, kb, colC + n);
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    M::mma(dQ_part[m][n / 8], dSa[m], &Kf[0]);
                    M::mma(dQ_part[m][n / 8 + 1], dSa[m], &Kf[2]);
                }
            }
        }
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int q = i * Br + qC + 16 * m + g + 8 * h;
                if (q >= N) continue;
                float *dst = dQ_acc + head + (size_t)q * HeadDim + colC + 2 * t;
#pragma unroll
                for (int nt = 0; nt < COLS_PER_WARP_C / 8; nt++)
                    atomic_add2(dst + nt * 8, dQ_part[m][nt][2 * h], dQ_part[m][nt][2 * h + 1]);
            }
    }

    /* dK_j = scale dS^T Q, dV_j = P^T dO: phase B's 32 keys x d/2, to HBM in the input dtype */
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int key = j * Bc + keyB + 16 * m + g + 8 * h;
            if (key >= N) continue;
#pragma unroll
            for (int nt = 0; nt < HeadDim / 16; nt++) {
                const size_t at = head + (size_t)key * HeadDim + colB + nt * 8 + 2 * t;
                *(uint32_t *)&dK[at] = M::pack(scale * dK_acc[m][nt][2 * h], scale * dK_acc[m][nt][2 * h + 1]);
                *(uint32_t *)&dV[at] = M::pack(dV_acc[m][nt][2 * h], dV_acc[m][nt][2 * h + 1]);
            }
        }
}

/* --deterministic: dQ_i for one Q tile, each warp its 16 rows, summed over the K/V tiles in order in
 * registers. Recomputes S = Q K^T and dP = dO V^T (the dK/dV kernel's are gone by now). */
template <typename T, int HeadDim>
__global__ void __launch_bounds__(DQ_THREADS)
stage10_dq_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                 const T *__restrict__ dO, const float *__restrict__ L2, const float *__restrict__ Dsum,
                 T *__restrict__ dQ, int N, int causal, float scale)
{
    typedef dq_smem_layout<HeadDim> Smem;
    typedef mma16<T> M;
    constexpr int Br = Smem::Br, Bc = Smem::Bc; /* queries per Q tile, keys per K/V tile */
    extern __shared__ __align__(128) unsigned char smem[];
    __half *Q_i = (__half *)(smem + Smem::Q_i), *dO_i = (__half *)(smem + Smem::dO_i);
    __half *K_j = (__half *)(smem + Smem::K_j), *V_j = (__half *)(smem + Smem::V_j);

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int i = blockIdx.x;
    const size_t bh = blockIdx.y, head = bh * N * HeadDim;
    const int q_w = warp * 16;
    const float scale_log2 = scale * LOG2E;
    const int Tc = CEIL_DIV(N, Bc);
    const int j_end = causal ? min(Tc, (min((i + 1) * Br, N) - 1) / Bc + 1) : Tc;

    load_tile_swizzled<T, HeadDim, Br, DQ_THREADS>(Q_i, Q + head, i * Br, N);
    load_tile_swizzled<T, HeadDim, Br, DQ_THREADS>(dO_i, dO + head, i * Br, N);
    /* this lane's two rows: L (log2 units) and D; a row past N has dO = 0, so its dS is 0 */
    float L_r[2], D_r[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int q = i * Br + q_w + g + 8 * h;
        L_r[h] = q < N ? L2[bh * N + q] : 0.f;
        D_r[h] = q < N ? Dsum[bh * N + q] : 0.f;
    }
    float dQ_acc[HeadDim / 8][4] = {};

    for (int j = 0; j < j_end; j++) {
        __syncthreads(); /* every warp is done with K_{j-1}, V_{j-1} */
        load_tile_swizzled<T, HeadDim, Bc, DQ_THREADS>(K_j, K + head, j * Bc, N);
        load_tile_swizzled<T, HeadDim, Bc, DQ_THREADS>(V_j, V + head, j * Bc, N);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads(); /* K_j, V_j (and Q_i, dO_i on the first step) in shared memory */

        float S[Bc / 8][4] = {}, dP[Bc / 8][4] = {};
#pragma unroll
        for (int k = 0; k < HeadDim; k += 16) {
            uint32_t Qf[4], dOf[4];
            frag_A<HeadDim>(Qf, Q_i, q_w, k);
            frag_A<HeadDim>(dOf, dO_i, q_w, k);
#pragma unroll
            for (int kb = 0; kb < Bc / 16; kb++) {
                uint32_t Kf[4], Vf[4];
                frag_Bt<HeadDim>(Kf, K_j, kb * 16, k);
                frag_Bt<HeadDim>(Vf, V_j, kb * 16, k);
                M::mma(S[2 * kb], Qf, &Kf[0]);
                M::mma(S[2 * kb + 1], Qf, &Kf[2]);
                M::mma(dP[2 * kb], dOf, &Vf[0]);
                M::mma(dP[2 * kb + 1], dOf, &Vf[2]);
            }
        }
        /* dS = P * (dP - D), P = exp2(scale log2e S - L log2e), masked to 0 */
        const bool need_mask = (j + 1) * Bc > N || (causal && (j + 1) * Bc - 1 > i * Br);
#pragma unroll
        for (int nt = 0; nt < Bc / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int h = c >> 1, key = j * Bc + nt * 8 + 2 * t + (c & 1), q = i * Br + q_w + g + 8 * h;
                float p = exp2_approx(fmaf(S[nt][c], scale_log2, -L_r[h]));
                if (need_mask && (key >= N || (causal && key > q))) p = 0.f;
                S[nt][c] = p * (dP[nt][c] - D_r[h]);
            }
        /* dQ_i += dS K_j */
#pragma unroll
        for (int kb = 0; kb < Bc / 16; kb++) {
            uint32_t dSa[4];
            pack_A<T>(dSa, S[2 * kb], S[2 * kb + 1]);
#pragma unroll
            for (int n = 0; n < HeadDim; n += 16) {
                uint32_t Kf[4];
                frag_B<HeadDim>(Kf, K_j, kb * 16, n);
                M::mma(dQ_acc[n / 8], dSa, &Kf[0]);
                M::mma(dQ_acc[n / 8 + 1], dSa, &Kf[2]);
            }
        }
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int q = i * Br + q_w + g + 8 * h;
        if (q >= N) continue;
#pragma unroll
        for (int nt = 0; nt < HeadDim / 8; nt++)
            *(uint32_t *)&dQ[head + (size_t)q * HeadDim + nt * 8 + 2 * t] =
                M::pack(scale * dQ_acc[nt][2 * h], scale * dQ_acc[nt][2 * h + 1]);
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

/* ---- launcher ---- */

/* The workspace: the fp32 dQ accumulator, then D and L * log2(e) (fp32, one each per row). */
size_t workspace_bytes(const struct shape *sh)
{
    return 2 * shape_rows(sh) * sizeof(float) + shape_elems(sh) * sizeof(float);
}

template <typename T, int HeadDim>
int launch(const struct attn_args *a, char *why, size_t n)
{
    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    if (bh > 65535) {
        snprintf(why, n, "batch * heads = %lld is more than a grid's y dimension holds (65535)", bh);
        return ATTN_UNSUPPORTED;
    }
    const size_t kv_smem = kv_smem_layout<HeadDim>::bytes, dq_smem = dq_smem_layout<HeadDim>::bytes;
    if (int rc = smem_optin(stage10_dkdv_kernel<T, HeadDim>, kv_smem, HeadDim, why, n)) return rc;
    if (int rc = smem_optin(stage10_dq_kernel<T, HeadDim>, dq_smem, HeadDim, why, n)) return rc;

    const size_t rows = shape_rows(sh), elems = shape_elems(sh);
    float *dQ_acc = (float *)a->work, *Dsum = dQ_acc + elems, *L2 = Dsum + rows; /* dQ_acc first: 16-byte aligned */
    const T *Q = (const T *)a->Q, *K = (const T *)a->K, *V = (const T *)a->V, *O = (const T *)a->O;
    const T *dO = (const T *)a->dO;

    stage10_preprocess_kernel<T, HeadDim><<<(unsigned)CEIL_DIV(rows, PRE_THREADS / (HeadDim / 8)), PRE_THREADS>>>(
        O, dO, a->L, Dsum, L2, a->deterministic ? NULL : dQ_acc, rows);
    CUDA_TRY(cudaGetLastError());
    stage10_dkdv_kernel<T, HeadDim><<<dim3(CEIL_DIV(sh->N, kv_cfg<HeadDim>::Bc), (unsigned)bh), KV_THREADS, kv_smem>>>(
        Q, K, V, dO, L2, Dsum, (T *)a->dK, (T *)a->dV, dQ_acc, sh->N, sh->causal, sh->scale, !a->deterministic);
    CUDA_TRY(cudaGetLastError());
    if (a->deterministic) {
        stage10_dq_kernel<T, HeadDim><<<dim3(CEIL_DIV(sh->N, dq_cfg::Br), (unsigned)bh), DQ_THREADS, dq_smem>>>(
            Q, K, V, dO, L2, Dsum, (T *)a->dQ, sh->N, sh->causal, sh->scale);
    } else {
        stage10_convert_kernel<T><<<(unsigned)std::min<size_t>(CEIL_DIV(elems / 8, 256), 65535), 256>>>(
            dQ_acc, (T *)a->dQ, elems / 8, sh->scale);
    }
    CUDA_TRY(cudaGetLastError());
    return 0;
}

template <typename T>
int dispatch(const struct attn_args *a, char *why, size_t n)
{
    if (a->sh.d == 64) return launch<T, 64>(a, why, n);
    if (a->sh.d == 128) return launch<T, 128>(a, why, n);
    snprintf(why, n, "supports head dim 64 or 128 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

int backward(const struct attn_args *a, char *why, size_t n)
{
    if (a->work == NULL) {
        snprintf(why, n, "needs its workspace (D and the fp32 dQ accumulator) and got none");
        return ATTN_UNSUPPORTED;
    }
    if (a->dtype == DT_F16) return dispatch<__half>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch<__nv_bfloat16>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

} // namespace

/* The forward is stage 9's: O and L for the backward come from it. */
extern "C" const struct stage stage9_desc;
static int forward(const struct attn_args *a, char *why, size_t n) { return stage9_desc.forward(a, why, n); }

extern "C" const struct stage stage10_desc = {
    .name = "stage10",
    .idea = "FA-2 backward: P recomputed from L, parallel over K/V tiles, dQ accumulated in fp32",
    .device = ON_GPU,
    .forward = forward,
    .backward = backward,
    .dims = {64, 128},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = workspace_bytes,
    .openmp = 0,
    .hbm_traffic = NULL,
    .measures_backward = 1,
    .arch_sm = 0,
};
