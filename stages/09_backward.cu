/* 09_backward.cu: FlashAttention-2 backward (FA-2 paper, section 3.2 and Algorithm 2)
 *
 * New in stage 9: the gradients dQ, dK, dV of the loss sum(dO * O), from Q, K, V, dO and what
 *   stage 8's forward leaves behind: O and the row logsumexp L. Three kernels:
 *   1. stage9_preprocess_kernel: D_i = rowsum(dO_i * O_i), one number per query row (and the
 *      fp32 dQ accumulator zeroed);
 *   2. stage9_dkdv_kernel, parallel over K/V tiles (grid = K/V tiles x batch*heads): a block keeps
 *      its K_j, V_j and their gradients dK_j, dV_j on chip and sweeps the Q tiles:
 *        S_ij = scale Q_i K_j^T,  P_ij = exp(S_ij - L_i)       recomputed, never stored
 *        dV_j += P_ij^T dO_i,  dP_ij = dO_i V_j^T,  dS_ij = P_ij * (dP_ij - D_i)
 *        dK_j += scale dS_ij^T Q_i,  dQ_i += scale dS_ij K_j   (fp32 atomics into HBM)
 *   3. stage9_convert_kernel: dQ from the fp32 accumulator to the input dtype.
 *   With --deterministic the dK/dV kernel skips dQ and stage9_dq_kernel computes it instead,
 *   parallel over Q tiles with dQ_i in registers: no atomics, the same bits on every run, at the
 *   price of recomputing S and dP once more.
 * Why this shape: dK_j and dV_j sum over every query, dQ_i over every key; a block can own one of
 *   the two sums and must share the other. FA-2 owns dK, dV (two accumulators on chip) and adds
 *   dQ into HBM. P is recomputed from Q, K and L rather than stored: storing it is N^2 per head,
 *   the very memory FlashAttention exists to avoid.
 * Measured on H200: see notes/09_backward.md.
 * Run: ./stage9 --seqlen 4096 --dim 64 --causal  (add --deterministic for the atomic-free dQ)
 */
#include "common/attn.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/mma.cuh"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

/* ---- configuration ---- */

#define LOG2E 1.4426950408889634f /* exp(x) = exp2(x * LOG2E) */
#define WARP_SIZE 32
#define FULL_MASK 0xffffffffu

/* Four warps. In the dK/dV kernel a block owns Bc = 64 keys, 16 per warp (dK_j and dV_j of its 16
 * keys in the warp's registers: 2 x 16 x D fp32, 2 x D / 2 registers per thread), and sweeps Q in
 * tiles of Br = 64 queries. In the dQ kernel each warp owns 16 query rows (Br = 64) and sweeps
 * K/V in tiles of Bc = 64. */
static constexpr int NWARPS = 4;
static constexpr int NTHREADS = NWARPS * WARP_SIZE;
static constexpr int Br = 64;
static constexpr int Bc = 64;
static_assert(Br == NWARPS * 16 && Bc == NWARPS * 16, "each warp owns one m16 tile of rows");

/* Shared memory of the dK/dV kernel: K_j, V_j, Q_i, dO_i [64][D] (swizzled), dS [Bc][Br] (the
 * keys' rows of dS^T, swizzled like a D = 64 tile), and L_i, D_i for the Q tile. */
template <int D>
struct stage9_smem {
    static constexpr size_t K_j = 0;
    static constexpr size_t V_j = K_j + 2 * (size_t)Bc * D;
    static constexpr size_t Q_i = V_j + 2 * (size_t)Bc * D;
    static constexpr size_t dO_i = Q_i + 2 * (size_t)Br * D;
    static constexpr size_t dS = dO_i + 2 * (size_t)Br * D;
    static constexpr size_t L_i = dS + 2 * (size_t)Bc * Br;
    static constexpr size_t D_i = L_i + sizeof(float) * Br;
    static constexpr size_t bytes = D_i + sizeof(float) * Br;
    static_assert(D % 64 == 0, "the swizzle below needs rows of 8 or more 16-byte chunks");
};

/* ---- kernels ---- */

/* Stage 8's swizzle (see there): logical 16-byte chunk c of row r stored at chunk c ^ (r mod 8),
 * so the 8 rows an ldmatrix reads fall in 8 different bank groups. Element offset. */
template <int D>
static __device__ __forceinline__ int stage9_swz(int row, int chunk)
{
    return row * D + ((chunk ^ (row & 7)) << 3);
}

/* Rows row0 .. row0+ROWS-1 of one head's [N, D] matrix into a swizzled tile; rows past N zero. */
template <typename T, int D, int ROWS>
static __device__ __forceinline__ void stage9_load_tile(T *tile, const T *src, int row0, int N)
{
    constexpr int CHUNKS = D / 8;
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += NTHREADS) {
        const int r = c / CHUNKS, chunk = c % CHUNKS;
        const bool valid = row0 + r < N;
        cp_async_16_zfill(tile + stage9_swz<D>(r, chunk), src + (size_t)(valid ? row0 + r : 0) * D + chunk * 8, valid);
    }
}

/* ldmatrix fragments from a swizzled tile, with the lane patterns of mma.cuh:
 *   A of rows r0 .. r0+15, columns k .. k+15 (non-transposed: the tile's rows are the A rows);
 *   B of rows r0 .. r0+15 read as 16 columns n of B (the tile holds B^T: "K in S = Q K^T");
 *   B^T: rows r0 .. r0+15 of the tile are the k rows of B, columns n .. n+15 ("V in P V"). */
template <int D>
static __device__ __forceinline__ void stage9_frag_A(uint32_t f[4], const __half *tile, int r0, int k)
{
    const int lane = threadIdx.x % WARP_SIZE;
    ldmatrix_x4(f, tile + stage9_swz<D>(r0 + (lane & 15), k / 8 + (lane >> 4)));
}
template <int D>
static __device__ __forceinline__ void stage9_frag_Bt(uint32_t f[4], const __half *tile, int r0, int k)
{
    const int lane = threadIdx.x % WARP_SIZE;
    ldmatrix_x4(f, tile + stage9_swz<D>(r0 + (lane & 7) + ((lane >> 4) << 3), k / 8 + ((lane >> 3) & 1)));
}
template <int D>
static __device__ __forceinline__ void stage9_frag_B(uint32_t f[4], const __half *tile, int r0, int n)
{
    const int lane = threadIdx.x % WARP_SIZE;
    ldmatrix_x4_trans(f, tile + stage9_swz<D>(r0 + (lane & 15), n / 8 + (lane >> 4)));
}

/* Two n8 C tiles (16 x 16 fp32, this lane's 8 values) as one k16 A fragment in 16-bit. */
template <typename T>
static __device__ __forceinline__ void stage9_pack_A(uint32_t a[4], const float c0[4], const float c1[4])
{
    a[0] = mma16<T>::pack(c0[0], c0[1]);
    a[1] = mma16<T>::pack(c0[2], c0[3]);
    a[2] = mma16<T>::pack(c1[0], c1[1]);
    a[3] = mma16<T>::pack(c1[2], c1[3]);
}

/* D_i = rowsum(dO_i * O_i) in fp32, one warp per row; the row's fp32 dQ accumulator zeroed. */
template <typename T, int D>
static __global__ void __launch_bounds__(NTHREADS)
stage9_preprocess_kernel(const T *__restrict__ O, const T *__restrict__ dO, float *__restrict__ Dsum,
                         float *__restrict__ dQ_acc, size_t rows)
{
    const size_t row = (size_t)blockIdx.x * NWARPS + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    float acc = 0.f;
    for (int c = lane; c < D; c += WARP_SIZE) {
        acc += (float)O[row * D + c] * (float)dO[row * D + c];
        if (dQ_acc) dQ_acc[row * D + c] = 0.f;
    }
    for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(FULL_MASK, acc, s);
    if (lane == 0) Dsum[row] = acc;
}

/* dK_j, dV_j for one K/V tile (and, unless deterministic, this tile's share of dQ). */
template <typename T, int D>
static __global__ void __launch_bounds__(NTHREADS)
stage9_dkdv_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                   const T *__restrict__ dO, const float *__restrict__ L, const float *__restrict__ Dsum,
                   T *__restrict__ dK, T *__restrict__ dV, float *__restrict__ dQ_acc, int N, int causal,
                   float scale, int with_dq)
{
    typedef stage9_smem<D> SM;
    typedef mma16<T> M;
    extern __shared__ __align__(128) unsigned char smem[];
    /* the tiles hold T; ldmatrix only moves 16-bit patterns, so they are addressed as __half */
    __half *K_j = (__half *)(smem + SM::K_j), *V_j = (__half *)(smem + SM::V_j);
    __half *Q_i = (__half *)(smem + SM::Q_i), *dO_i = (__half *)(smem + SM::dO_i);
    __half *dS_s = (__half *)(smem + SM::dS);
    float *L_s = (float *)(smem + SM::L_i), *D_s = (float *)(smem + SM::D_i);

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int j = blockIdx.x;                      /* this block's K/V tile */
    const size_t bh = blockIdx.y, head = bh * N * D;
    const int key_w = warp * 16;                   /* this warp's keys within K_j (dK, dV rows) */
    const int q_w = warp * 16;                     /* this warp's queries within Q_i (dQ rows) */
    const float scale_log2 = scale * LOG2E;
    const int Tr = CEIL_DIV(N, Br);
    /* causal: Q tiles wholly above the diagonal (every query before every key of K_j) see none of it */
    const int i_first = causal ? (j * Bc) / Br : 0;

    stage9_load_tile<T, D, Bc>((T *)K_j, K + head, j * Bc, N);
    stage9_load_tile<T, D, Bc>((T *)V_j, V + head, j * Bc, N);

    float dK_acc[D / 8][4] = {}, dV_acc[D / 8][4] = {}; /* this warp's 16 keys x D */

    for (int i = i_first; i < Tr; i++) {
        /* Q_i, dO_i by cp.async; L_i (in log2 units) and D_i by plain loads. Their buffers are
         * free: every warp passed the previous step's second barrier after its last read. A query
         * past N gets L = +inf, so its P row is 0 and it contributes nothing. */
        stage9_load_tile<T, D, Br>((T *)Q_i, Q + head, i * Br, N);
        stage9_load_tile<T, D, Br>((T *)dO_i, dO + head, i * Br, N);
        cp_async_commit();
        if (tid < Br) {
            const int q = i * Br + tid;
            L_s[tid] = q < N ? L[bh * N + q] * LOG2E : INFINITY;
            D_s[tid] = q < N ? Dsum[bh * N + q] : 0.f;
        }
        cp_async_wait<0>();
        __syncthreads(); /* Q_i, dO_i, L_i, D_i (and K_j, V_j on the first step) in shared memory */

        /* S^T = K_w Q_i^T: this warp's 16 keys x 64 queries (raw scores) */
        float ST[Br / 8][4] = {};
#pragma unroll
        for (int k = 0; k < D; k += 16) {
            uint32_t Kf[4];
            stage9_frag_A<D>(Kf, K_j, key_w, k);
#pragma unroll
            for (int qb = 0; qb < Br / 16; qb++) {
                uint32_t Qf[4];
                stage9_frag_Bt<D>(Qf, Q_i, qb * 16, k);
                M::mma(ST[2 * qb], Kf, &Qf[0]);
                M::mma(ST[2 * qb + 1], Kf, &Qf[2]);
            }
        }
        /* P^T = exp2(scale log2e S^T - L log2e), 0 where masked (key past N; causal: key after
         * query). C layout: ST[nt][c] is key key_w + g + 8 (c >> 1), query nt*8 + 2t + (c & 1). */
        const bool need_mask = (j + 1) * Bc > N || (causal && (j + 1) * Bc - 1 > i * Br);
#pragma unroll
        for (int nt = 0; nt < Br / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int key = j * Bc + key_w + g + 8 * (c >> 1), ql = nt * 8 + 2 * t + (c & 1);
                float p = exp2_approx(fmaf(ST[nt][c], scale_log2, -L_s[ql]));
                if (need_mask && (key >= N || (causal && key > i * Br + ql))) p = 0.f;
                ST[nt][c] = p;
            }

        /* dV_w += P^T dO_i */
#pragma unroll
        for (int qb = 0; qb < Br / 16; qb++) {
            uint32_t Pa[4];
            stage9_pack_A<T>(Pa, ST[2 * qb], ST[2 * qb + 1]);
#pragma unroll
            for (int n = 0; n < D; n += 16) {
                uint32_t dOf[4];
                stage9_frag_B<D>(dOf, dO_i, qb * 16, n);
                M::mma(dV_acc[n / 8], Pa, &dOf[0]);
                M::mma(dV_acc[n / 8 + 1], Pa, &dOf[2]);
            }
        }

        /* dP^T = V_w dO_i^T, then dS^T = P^T * (dP^T - D) */
        float dST[Br / 8][4] = {};
#pragma unroll
        for (int k = 0; k < D; k += 16) {
            uint32_t Vf[4];
            stage9_frag_A<D>(Vf, V_j, key_w, k);
#pragma unroll
            for (int qb = 0; qb < Br / 16; qb++) {
                uint32_t dOf[4];
                stage9_frag_Bt<D>(dOf, dO_i, qb * 16, k);
                M::mma(dST[2 * qb], Vf, &dOf[0]);
                M::mma(dST[2 * qb + 1], Vf, &dOf[2]);
            }
        }
#pragma unroll
        for (int nt = 0; nt < Br / 8; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) dST[nt][c] = ST[nt][c] * (dST[nt][c] - D_s[nt * 8 + 2 * t + (c & 1)]);

        /* dK_w += dS^T Q_i (scaled at the end) */
#pragma unroll
        for (int qb = 0; qb < Br / 16; qb++) {
            uint32_t dSa[4];
            stage9_pack_A<T>(dSa, dST[2 * qb], dST[2 * qb + 1]);
#pragma unroll
            for (int n = 0; n < D; n += 16) {
                uint32_t Qf[4];
                stage9_frag_B<D>(Qf, Q_i, qb * 16, n);
                M::mma(dK_acc[n / 8], dSa, &Qf[0]);
                M::mma(dK_acc[n / 8 + 1], dSa, &Qf[2]);
            }
        }

        if (with_dq) {
            /* dQ_i += dS K_j: dS^T goes to shared memory (keys' rows, 16-bit), then each warp
             * takes 16 queries over all 64 keys, reading dS^T transposed, and adds its 16 x D into
             * the fp32 accumulator in HBM (atomics: every K/V tile's block adds to the same rows). */
#pragma unroll
            for (int nt = 0; nt < Br / 8; nt++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(uint32_t *)&dS_s[stage9_swz<Br>(key_w + g + 8 * h, nt) + 2 * t] =
                        M::pack(dST[nt][2 * h], dST[nt][2 * h + 1]);
        }
        __syncthreads(); /* dS^T in shared memory; every warp is done with Q_i, dO_i, L_i, D_i */
        if (with_dq) {
            float dQ_part[D / 8][4] = {};
#pragma unroll
            for (int kb = 0; kb < Bc / 16; kb++) {
                uint32_t dSa[4]; /* A = dS (queries x keys) = the stored dS^T, transposed */
                ldmatrix_x4_trans(dSa, dS_s + stage9_swz<Br>(kb * 16 + (lane & 7) + ((lane >> 4) << 3),
                                                             q_w / 8 + ((lane >> 3) & 1)));
#pragma unroll
                for (int n = 0; n < D; n += 16) {
                    uint32_t Kf[4];
                    stage9_frag_B<D>(Kf, K_j, kb * 16, n);
                    M::mma(dQ_part[n / 8], dSa, &Kf[0]);
                    M::mma(dQ_part[n / 8 + 1], dSa, &Kf[2]);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int q = i * Br + q_w + g + 8 * h;
                if (q >= N) continue;
                float *dst = dQ_acc + head + (size_t)q * D;
#pragma unroll
                for (int nt = 0; nt < D / 8; nt++) {
                    atomicAdd(dst + nt * 8 + 2 * t, dQ_part[nt][2 * h]);
                    atomicAdd(dst + nt * 8 + 2 * t + 1, dQ_part[nt][2 * h + 1]);
                }
            }
        }
        /* the next step's loads write Q_i, dO_i, L_i, D_i (all read before the barrier above);
         * its dS^T writes come after its first barrier, which every warp reaches only after
         * finishing this step's dQ reads */
    }

    /* dK_j = scale dS^T Q, dV_j = P^T dO: this warp's 16 keys, to HBM in the input dtype */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int key = j * Bc + key_w + g + 8 * h;
        if (key >= N) continue;
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            const size_t at = head + (size_t)key * D + nt * 8 + 2 * t;
            *(uint32_t *)&dK[at] = M::pack(scale * dK_acc[nt][2 * h], scale * dK_acc[nt][2 * h + 1]);
            *(uint32_t *)&dV[at] = M::pack(dV_acc[nt][2 * h], dV_acc[nt][2 * h + 1]);
        }
    }
}

/* --deterministic: dQ_i for one Q tile, each warp its 16 rows, summed over the K/V tiles in order in
 * registers. Recomputes S = Q K^T and dP = dO V^T (the dK/dV kernel's are gone by now). */
template <typename T, int D>
static __global__ void __launch_bounds__(NTHREADS)
stage9_dq_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V,
                 const T *__restrict__ dO, const float *__restrict__ L, const float *__restrict__ Dsum,
                 T *__restrict__ dQ, int N, int causal, float scale)
{
    typedef stage9_smem<D> SM;
    typedef mma16<T> M;
    extern __shared__ __align__(128) unsigned char smem[];
    /* the same layout as the dK/dV kernel; here Q_i, dO_i stay and K_j, V_j change per step */
    __half *K_j = (__half *)(smem + SM::K_j), *V_j = (__half *)(smem + SM::V_j);
    __half *Q_i = (__half *)(smem + SM::Q_i), *dO_i = (__half *)(smem + SM::dO_i);

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;
    const int i = blockIdx.x;
    const size_t bh = blockIdx.y, head = bh * N * D;
    const int q_w = warp * 16;
    const float scale_log2 = scale * LOG2E;
    const int Tc = CEIL_DIV(N, Bc);
    const int j_end = causal ? min(Tc, (min((i + 1) * Br, N) - 1) / Bc + 1) : Tc;

    stage9_load_tile<T, D, Br>((T *)Q_i, Q + head, i * Br, N);
    stage9_load_tile<T, D, Br>((T *)dO_i, dO + head, i * Br, N);
    /* this lane's two rows: L (log2 units) and D */
    float L_r[2], D_r[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int q = i * Br + q_w + g + 8 * h;
        L_r[h] = q < N ? L[bh * N + q] * LOG2E : INFINITY;
        D_r[h] = q < N ? Dsum[bh * N + q] : 0.f;
    }
    float dQ_acc[D / 8][4] = {};

    for (int j = 0; j < j_end; j++) {
        __syncthreads(); /* every warp is done with K_{j-1}, V_{j-1} */
        stage9_load_tile<T, D, Bc>((T *)K_j, K + head, j * Bc, N);
        stage9_load_tile<T, D, Bc>((T *)V_j, V + head, j * Bc, N);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads(); /* K_j, V_j (and Q_i, dO_i on the first step) in shared memory */

        float S[Bc / 8][4] = {}, dP[Bc / 8][4] = {};
#pragma unroll
        for (int k = 0; k < D; k += 16) {
            uint32_t Qf[4], dOf[4];
            stage9_frag_A<D>(Qf, Q_i, q_w, k);
            stage9_frag_A<D>(dOf, dO_i, q_w, k);
#pragma unroll
            for (int kb = 0; kb < Bc / 16; kb++) {
                uint32_t Kf[4], Vf[4];
                stage9_frag_Bt<D>(Kf, K_j, kb * 16, k);
                stage9_frag_Bt<D>(Vf, V_j, kb * 16, k);
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
            stage9_pack_A<T>(dSa, S[2 * kb], S[2 * kb + 1]);
#pragma unroll
            for (int n = 0; n < D; n += 16) {
                uint32_t Kf[4];
                stage9_frag_B<D>(Kf, K_j, kb * 16, n);
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
        for (int nt = 0; nt < D / 8; nt++)
            *(uint32_t *)&dQ[head + (size_t)q * D + nt * 8 + 2 * t] =
                M::pack(scale * dQ_acc[nt][2 * h], scale * dQ_acc[nt][2 * h + 1]);
    }
}

/* dQ = scale * the fp32 accumulator, in the input dtype. */
template <typename T>
static __global__ void stage9_convert_kernel(const float *__restrict__ dQ_acc, T *__restrict__ dQ, size_t n, float scale)
{
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x)
        dQ[k] = (T)(scale * dQ_acc[k]);
}

/* ---- launcher ---- */

/* The workspace: D (fp32, one per row), then the fp32 dQ accumulator. */
static size_t stage9_workspace_bytes(const struct shape *sh)
{
    return shape_rows(sh) * sizeof(float) + shape_elems(sh) * sizeof(float);
}

template <typename T, int D>
static int stage9_launch(const struct attn_args *a, char *why, size_t n)
{
    const struct shape *sh = &a->sh;
    const size_t smem = stage9_smem<D>::bytes;
    int dev = 0, optin = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (smem > (size_t)optin) {
        snprintf(why, n, "stage9: d=%d needs %zu bytes of shared memory per block; this device allows %d", D, smem, optin);
        return 1;
    }
    const long long bh = (long long)sh->B * sh->H;
    if (bh > 65535) {
        snprintf(why, n, "stage9: batch * heads = %lld is more than a grid's y dimension holds (65535)", bh);
        return 1;
    }
    CUDA_TRY(cudaFuncSetAttribute(stage9_dkdv_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_TRY(cudaFuncSetAttribute(stage9_dq_kernel<T, D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));

    const size_t rows = shape_rows(sh), elems = shape_elems(sh);
    float *Dsum = (float *)a->work, *dQ_acc = Dsum + rows;
    const T *Q = (const T *)a->Q, *K = (const T *)a->K, *V = (const T *)a->V, *O = (const T *)a->O;
    const T *dO = (const T *)a->dO;

    stage9_preprocess_kernel<T, D><<<(unsigned)CEIL_DIV(rows, NWARPS), NTHREADS>>>(
        O, dO, Dsum, a->deterministic ? NULL : dQ_acc, rows);
    CUDA_TRY(cudaGetLastError());
    stage9_dkdv_kernel<T, D><<<dim3(CEIL_DIV(sh->N, Bc), (unsigned)bh), NTHREADS, smem>>>(
        Q, K, V, dO, a->L, Dsum, (T *)a->dK, (T *)a->dV, dQ_acc, sh->N, sh->causal, sh->scale, !a->deterministic);
    CUDA_TRY(cudaGetLastError());
    if (a->deterministic) {
        stage9_dq_kernel<T, D><<<dim3(CEIL_DIV(sh->N, Br), (unsigned)bh), NTHREADS, smem>>>(
            Q, K, V, dO, a->L, Dsum, (T *)a->dQ, sh->N, sh->causal, sh->scale);
    } else {
        stage9_convert_kernel<T><<<(unsigned)std::min<size_t>(CEIL_DIV(elems, 256), 65535), 256>>>(
            dQ_acc, (T *)a->dQ, elems, sh->scale);
    }
    CUDA_TRY(cudaGetLastError());
    return 0;
}

template <typename T>
static int stage9_dispatch(const struct attn_args *a, char *why, size_t n)
{
    if (a->sh.d == 64) return stage9_launch<T, 64>(a, why, n);
    if (a->sh.d == 128) return stage9_launch<T, 128>(a, why, n);
    snprintf(why, n, "stage9 supports head dim 64 or 128 (got d=%d)", a->sh.d);
    return 1;
}

static int stage9_backward(const struct attn_args *a, char *why, size_t n)
{
    if (a->work == NULL) {
        snprintf(why, n, "stage9 needs its workspace (D and the fp32 dQ accumulator) and got none");
        return 1;
    }
    if (a->dtype == DT_F16) return stage9_dispatch<__half>(a, why, n);
    if (a->dtype == DT_BF16) return stage9_dispatch<__nv_bfloat16>(a, why, n);
    snprintf(why, n, "stage9 supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return 1;
}

/* The forward is stage 8's: O and L for the backward come from it. */
extern "C" const struct stage stage8_desc;
static int stage9_forward(const struct attn_args *a, char *why, size_t n) { return stage8_desc.forward(a, why, n); }

extern "C" const struct stage stage9_desc = {
    .name = "stage9",
    .idea = "FA-2 backward: P recomputed from L, parallel over K/V tiles, dQ accumulated in fp32",
    .device = ON_GPU,
    .forward = stage9_forward,
    .backward = stage9_backward,
    .dims = {64, 128},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = stage9_workspace_bytes,
    .openmp = 0,
    .hbm_traffic = NULL,
    .measures_backward = 1,
};
