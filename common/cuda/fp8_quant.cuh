/* fp8_quant.cuh: the FP8 forward's quantization (stage 19): Q, K and V from fp16 to e4m3 with one
 * fp32 scale per block of ROWS rows of a head, Q and K first multiplied by the random-sign Hadamard
 * matrix of incoherent processing (fp8.h), V written transposed and permuted for the FP8 wgmma.
 *
 * A scale is max|x| / 448 over its block (all zeros: 1, or 2^-64 for V; the kernel says why), so the block's largest
 * element lands on e4m3's largest, 448, and x8 = e4m3(x times 1 / scale). Rows past N (the padding of the
 * last block) are zeros.
 *
 * Why V is transposed: in O = P V the keys are the k of the product, and 8-bit wgmma takes both
 * operands K-major (no transpose): V must be stored [d][keys] (V^T), each row of it contiguous along
 * the keys. Why it is permuted: P comes out of the accumulators of S = Q K^T with each thread
 * holding keys 2t, 2t + 1 of every n8 tile (wgmma.cuh, the D layout), but the 8-bit A layout wants
 * a thread's register to hold four consecutive k: 4t .. 4t + 3. Rather than move P between lanes,
 * the kernel packs each thread's own keys, and V^T's columns are ordered to match: within each
 * group of 32 keys, column p of V^T holds key key_of_position(p). Both products sum over the same
 * 32 keys, only in another order.
 *
 * Hopper or not: these kernels are plain CUDA (the e4m3 conversion, cvt with .e4m3x2, needs
 * compute capability 8.9 or later). */
#ifndef FP8_QUANT_CUH
#define FP8_QUANT_CUH

#include "common/cuda/defs.cuh"
#include "common/cuda/wgmma.cuh"

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

/* The key whose value column p of a 32-key group of V^T holds: p = 16 hi + 4 t + u is byte u of
 * A register (hi ? 2 : 0) of thread t (wgmma.cuh, the 8-bit A layout), which packs that thread's
 * keys 2t, 2t + 1, 8 + 2t, 9 + 2t (u = 0 .. 3), 16 higher for hi = 1. */
static __host__ __device__ __forceinline__ int key_of_position(int p)
{
    const int hi = p >> 4, t = (p >> 2) & 3, u = p & 3;
    return 16 * hi + 2 * t + (u & 1) + 8 * (u >> 1);
}

/* The random signs of the Hadamard transform, one per channel (fp8.h's hadamard_signs), by value. */
struct hadamard_sign_bits {
    uint32_t bits[8]; /* bit c: channel c's sign is -1 (d <= 256) */
};

/* Row r's HeadDim / 32 consecutive elements held by a lane (lane l: l (HeadDim / 32) ..), multiplied
 * by H diag(signs) / sqrt(HeadDim): the butterflies within the lane first (strides 1 .. E / 2), then
 * across lanes by shuffles (strides E .. HeadDim / 2, lane masks 1 .. 16). Every lane of the warp
 * takes part. */
template <int HeadDim>
static __device__ __forceinline__ void hadamard_lane(float (&v)[HeadDim / 32], const hadamard_sign_bits &s, int lane)
{
    constexpr int E = HeadDim / 32;
#pragma unroll
    for (int j = 0; j < E; j++) {
        const int c = lane * E + j;
        if (s.bits[c >> 5] >> (c & 31) & 1) v[j] = -v[j];
    }
#pragma unroll
    for (int h = 1; h < E; h *= 2)
#pragma unroll
        for (int j = 0; j < E; j++)
            if (!(j & h)) {
                const float a = v[j], b = v[j + h];
                v[j] = a + b, v[j + h] = a - b;
            }
#pragma unroll
    for (int m = 1; m < 32; m *= 2) { /* stride m E: the partner lane differs in bit m */
        /* the lower lane keeps v + other, the upper other - v: other + sign v, one FFMA (a select
         * and an add were two instructions a value, and the pass is bound by issue) */
        const float sign = lane & m ? -1.f : 1.f;
#pragma unroll
        for (int j = 0; j < E; j++) v[j] = fmaf(sign, v[j], __shfl_xor_sync(FULL_MASK, v[j], m));
    }
    const float norm = rsqrtf((float)HeadDim);
#pragma unroll
    for (int j = 0; j < E; j++) v[j] *= norm;
}

/* A lane's E consecutive fp16 values of a row, p 2E-byte aligned, in one load (4, 8 or 16 bytes). */
template <int E>
static __device__ __forceinline__ void load_halves(const __half *p, float (&v)[E])
{
    static_assert(E == 2 || E == 4 || E == 8, "2, 4 or 8 values a lane");
    uint32_t w[E / 2];
    if constexpr (E == 2) {
        w[0] = __ldg((const unsigned int *)p);
    } else if constexpr (E == 4) {
        const uint2 u = __ldg((const uint2 *)p);
        w[0] = u.x, w[1] = u.y;
    } else {
        const uint4 u = __ldg((const uint4 *)p);
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
    }
#pragma unroll
    for (int k = 0; k < E / 2; k++) {
        __half2 h;
        memcpy(&h, &w[k], sizeof h);
        v[2 * k] = __low2float(h), v[2 * k + 1] = __high2float(h);
    }
}

/* One block of ROWS rows of one head (blockIdx.x the block, blockIdx.y the head), ROWS / WARPS rows
 * a warp: Q or K (TRANSPOSE = false) into X8 [heads][Npad][HeadDim], V (TRANSPOSE = true) into X8
 * [heads][HeadDim][Npad] permuted by key_of_position; the block's scale into scales[head][block].
 * One pass over memory: a warp loads all its rows at once (as many loads in flight a lane as it has
 * rows: the pass is bound by memory, and one row at a time would leave it bound by latency), keeps
 * them in registers through the transform and the block's max|x|, and quantizes them from there.
 * V's bytes go through shared memory, [HeadDim][ROWS] in V^T's order, and leave 16 bytes at a time
 * along each row of V^T: written straight from the warps, a lane's bytes would land in HeadDim / 32
 * rows Npad bytes apart, one byte per row and store. */
template <int HeadDim, int ROWS, bool HADAMARD, bool TRANSPOSE, int THREADS, int PITCH = HeadDim>
__global__ void __launch_bounds__(THREADS)
fp8_quantize_kernel(const __half *__restrict__ X, uint8_t *__restrict__ X8, float *__restrict__ scales, int N, int Npad,
                    hadamard_sign_bits signs)
{
    constexpr int E = HeadDim / 32, WARPS = THREADS / WARP_SIZE, RPW = ROWS / WARPS;
    static_assert(HeadDim % 32 == 0 && E >= 2 && E <= 8 && (E & (E - 1)) == 0, "d = 64 .. 256, a power of 2");
    static_assert(ROWS % 32 == 0, "whole 32-key groups of V^T");
    static_assert(ROWS % WARPS == 0, "the same number of rows for every warp");
    __shared__ float warp_max[WARPS];
    /* (TRANSPOSE) the block's V^T: row c holds channel c of the ROWS keys, in V^T's order; rows
     * 4 bytes longer than ROWS, so that the 32 lanes' stores of one step (rows E apart) spread
     * over 16, 8 or 4 banks (d = 64, 128, 256) instead of 1 */
    constexpr int T_ROW = ROWS + 4;
    __shared__ __align__(16) uint8_t vt[TRANSPOSE ? HeadDim : 1][TRANSPOSE ? T_ROW : 1];
    const int warp = threadIdx.x / WARP_SIZE, lane = threadIdx.x % WARP_SIZE;
    const size_t head = blockIdx.y;
    const int r0 = blockIdx.x * ROWS;
    const __half *src = X + head * N * HeadDim;

    float v[RPW][E]; /* row r0 + warp + i WARPS in v[i]; rows past N zeros */
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = r0 + warp + i * WARPS;
        if (r < N) load_halves<E>(src + (size_t)r * HeadDim + lane * E, v[i]);
        else
#pragma unroll
            for (int j = 0; j < E; j++) v[i][j] = 0.f;
    }
    float amax = 0.f;
#pragma unroll
    for (int i = 0; i < RPW; i++) {
        if constexpr (HADAMARD) hadamard_lane<HeadDim>(v[i], signs, lane);
#pragma unroll
        for (int j = 0; j < E; j++) amax = fmaxf(amax, fabsf(v[i][j]));
    }
#pragma unroll
    for (int m = 16; m > 0; m /= 2) amax = fmaxf(amax, __shfl_xor_sync(FULL_MASK, amax, m));
    if (lane == 0) warp_max[warp] = amax;
    __syncthreads();
    amax = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; w++) amax = fmaxf(amax, warp_max[w]);
    /* an all-zero block: its x8 are zeros whatever the scale; 1 for Q and K, but for V a tiny one,
     * since stage 19 folds V's scales into P against the head's largest (SV), which a 1 here would
     * set far above the other blocks' (about max|V| / 448), pushing every P into e4m3's subnormals */
    const float scale = amax > 0.f ? amax / 448.f : TRANSPOSE ? 0x1p-64f : 1.f, inv = 1.f / scale;
    if (threadIdx.x == 0) scales[head * (Npad / ROWS) + blockIdx.x] = scale;

#pragma unroll
    for (int i = 0; i < RPW; i++) {
        const int r = r0 + warp + i * WARPS;
        if constexpr (!TRANSPOSE) {
            static_assert(PITCH >= HeadDim && (PITCH - HeadDim) % 4 == 0, "whole 4-byte zeros past d");
            uint8_t *row = X8 + (head * Npad + r) * PITCH, *dst = row + lane * E;
#pragma unroll
            for (int z = HeadDim + 4 * lane; z < PITCH; z += 4 * WARP_SIZE) *(uint32_t *)(row + z) = 0u; /* bytes d .. PITCH */
            if constexpr (E >= 4) {
#pragma unroll
                for (int j = 0; j < E; j += 4)
                    *(uint32_t *)(dst + j) =
                        pack_e4m3x4(v[i][j] * inv, v[i][j + 1] * inv, v[i][j + 2] * inv, v[i][j + 3] * inv);
            } else { /* d = 64: two elements a lane */
                *(uint16_t *)dst = (uint16_t)pack_e4m3x4(v[i][0] * inv, v[i][1] * inv, 0.f, 0.f);
            }
        } else {
            /* key r goes to the position p of its 32-key group with key_of_position(p) = r mod 32 */
            const int k = r & 31;
            const int t = (k & 7) >> 1, u = (k & 1) + 2 * ((k >> 3) & 1), hi = k >> 4;
            const int col = (r & ~31) - r0 + 16 * hi + 4 * t + u; /* within the block */
#pragma unroll
            for (int j = 0; j < E; j++) vt[lane * E + j][col] = (uint8_t)(pack_e4m3x4(v[i][j] * inv, 0.f, 0.f, 0.f) & 0xff);
        }
    }
    if constexpr (TRANSPOSE) {
        __syncthreads(); /* the block's V^T in shared memory */
        static_assert(ROWS % 16 == 0, "16-byte pieces of a row of V^T");
        constexpr int PIECES = ROWS / 16; /* per row of V^T */
        for (int c = threadIdx.x; c < HeadDim * PIECES; c += THREADS) {
            const int row = c / PIECES, piece = c % PIECES;
            const uint32_t *src = (const uint32_t *)&vt[row][piece * 16];
            *(uint4 *)(X8 + (head * HeadDim + row) * Npad + r0 + piece * 16) = make_uint4(src[0], src[1], src[2], src[3]);
        }
    }
}

#endif
