/* test_wgmma.cu: the Hopper helpers of common/cuda/wgmma.cuh on the GPU, against the CPU.
 * Compiled for sm_90a alone (the Makefile's HOPPER_OBJS); every test skips with a one-line reason
 * unless the device is of compute capability 9.0.
 *
 * wgmma::sw128_layout          load_tile_sw128 (cp.async) puts element (r, col) where the layout
 *                              drawn in wgmma.cuh says, over 1024-byte atoms and column blocks; rows
 *                              at or past N come back zero over a nonzero pre-fill.
 * wgmma::sw128_loader_{tail,whole}  the same layout from sw128_tile_loader (addresses worked out
 *                              once per thread), on a tail tile and on a whole one.
 * wgmma::ss_{f16,bf16}_n64_kmajor     one warpgroup, C = A * B + C0, A (64 x K) and B from shared
 * wgmma::ss_{f16,bf16}_n128_kmajor    memory (the SS form) in the 128-byte swizzle, B K-major (stored
 *                              [N][K], as K_j in S = Q K^T), K / 16 wgmma in one commit group, the
 *                              accumulators in the documented D layout. n64 with K = 64 is S at
 *                              Bc = 64, d = 64; n128 with K = 128 is S at Bc = 128, d = 128 (two
 *                              column blocks of A and B: the k steps cross from one to the next).
 * wgmma::ss_{f16,bf16}_n64_mnmajor    the same with B MN-major (stored [K][N], imm-trans-b = 1).
 * wgmma::ss_{f16,bf16}_first_step     accumulate = 0 on the first k step: D = A * B whatever D held
 *                              (pre-filled with NaN), the scale-d predicate.
 * wgmma::rs_{f16,bf16}_n64_mnmajor    the RS form, A from registers in the documented A layout, B
 * wgmma::rs_{f16,bf16}_n128_mnmajor   MN-major: O = P V at d = 64 (K = Bc = 128), d = 128 (K = 128:
 * wgmma::rs_{f16,bf16}_n256_mnmajor   two column blocks of B, LBO between them) and d = 256 (K = 64,
 *                              four column blocks).
 * wgmma::rs_{f16,bf16}_n64_kmajor     the RS form with B K-major.
 *
 * Exactness, as in test_mma.cu: every input is a multiple of 1/8 in [-4, 4], exact in fp16 and
 * bf16, and so is C0; with K <= 128 every partial sum is a multiple of 1/64 below 2^11 + 4 in
 * magnitude: at most 18 significant bits, exact in fp32 in any order. The results must equal the
 * fp64 CPU product exactly: any difference is a layout or descriptor bug, not rounding.
 */
/* common_test.h declares C functions without extern "C": included inside a block of it, after
 * the C++ headers it pulls in (as in test_mma.cu). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
extern "C" {
#include "tests/common_test.h"
}
#include "common/cuda/cuda_check.h"
#include "common/cuda/wgmma.cuh"
#include "common/half.h"

#include <math.h>
#include <string.h>
#include <vector>

#define TEST_WG_THREADS 128 /* one warpgroup */
#define TEST_WG_M 64        /* the rows of one wgmma */
#define TEST_WG_ARCH 90     /* compute capability the sm_90a code runs on */

static void test_require_hopper(void) { test_require_gpu_arch(TEST_WG_ARCH, "wgmma (sm_90a)"); }

/* ---- the layout load_tile_sw128 writes ---- */

#define TEST_SW_ROWS 32      /* four atoms down */
#define TEST_SW_ELEMS 128    /* two column blocks */
#define TEST_SW_N 27         /* rows 27 .. 31 are past N: zero-filled */
#define TEST_SW_FILL 0xA5A5u /* shared memory's pre-fill: a zero must come from zfill */

/* The tile as load_tile_sw128 (HOISTED = 0) or sw128_tile_loader (1) leaves it in shared memory,
 * copied out raw. */
template <int HOISTED>
static __global__ void test_sw128_kernel(const uint16_t *src, uint16_t *raw, int N)
{
    extern __shared__ __align__(1024) uint16_t tile[];
    for (int i = threadIdx.x; i < TEST_SW_ROWS * TEST_SW_ELEMS; i += blockDim.x) tile[i] = TEST_SW_FILL;
    __syncthreads(); /* the pre-fill is in place before any cp.async lands on it */
    if (HOISTED) {
        const sw128_tile_loader<__half, TEST_SW_ELEMS, TEST_SW_ROWS, TEST_WG_THREADS> loader;
        static_assert(decltype(loader)::HOISTED, "the test shape takes the hoisted path");
        loader.load(tile, (const __half *)src, 0, N);
    } else {
        load_tile_sw128<__half, TEST_SW_ELEMS, TEST_SW_ROWS, TEST_WG_THREADS>(tile, (const __half *)src, 0, N);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads(); /* every thread's copies in place before any thread reads them */
    for (int i = threadIdx.x; i < TEST_SW_ROWS * TEST_SW_ELEMS; i += blockDim.x) raw[i] = tile[i];
}

/* One of the two loaders, rows at or past N zero-filled, against the layout drawn in wgmma.cuh. */
static void test_sw128_layout(int hoisted, int N)
{
    test_require_hopper();
    enum { ELEMS = TEST_SW_ROWS * TEST_SW_ELEMS };
    std::vector<uint16_t> src(ELEMS), raw(ELEMS), want(ELEMS);
    for (int i = 0; i < ELEMS; i++) src[i] = (uint16_t)(1 + i); /* never 0, and each element its own */
    /* the picture in wgmma.cuh: element (r, col) -> column block col / 64 (TEST_SW_ROWS rows of
     * 128 bytes each), row r, 16-byte chunk ((col % 64) / 8) ^ (r % 8), element col % 8 */
    for (int r = 0; r < TEST_SW_ROWS; r++)
        for (int col = 0; col < TEST_SW_ELEMS; col++) {
            int at = (col / 64) * TEST_SW_ROWS * 64 + r * 64 + ((((col % 64) / 8) ^ (r % 8)) * 8) + col % 8;
            want[at] = r < N ? src[r * TEST_SW_ELEMS + col] : 0;
        }

    uint16_t *dsrc, *draw;
    CUDA_CHECK(cudaMalloc(&dsrc, ELEMS * 2));
    CUDA_CHECK(cudaMalloc(&draw, ELEMS * 2));
    CUDA_CHECK(cudaMemcpy(dsrc, src.data(), ELEMS * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(draw, 0x5a, ELEMS * 2));
    if (hoisted)
        test_sw128_kernel<1><<<1, TEST_WG_THREADS, ELEMS * 2>>>(dsrc, draw, N);
    else
        test_sw128_kernel<0><<<1, TEST_WG_THREADS, ELEMS * 2>>>(dsrc, draw, N);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(raw.data(), draw, ELEMS * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dsrc));
    CUDA_CHECK(cudaFree(draw));

    int first = -1, differ = 0;
    for (int i = 0; i < ELEMS; i++)
        if (raw[i] != want[i]) {
            if (first < 0) first = i;
            differ++;
        }
    int i = first < 0 ? 0 : first;
    cr_assert(differ == 0, "%s, N = %d: shared element %d (block %d, row %d, chunk %d, element %d) holds 0x%04x, "
              "want 0x%04x; %d of %d differ", hoisted ? "sw128_tile_loader" : "load_tile_sw128", N, i,
              i / (TEST_SW_ROWS * 64), i % (TEST_SW_ROWS * 64) / 64, i % 64 / 8, i % 8, raw[i], want[i], differ,
              (int)ELEMS);
}

Test(wgmma, sw128_layout) { test_sw128_layout(0, TEST_SW_N); }
/* the hoisted copy: a tail tile (rows tested one by one) and a whole one (no test at all) */
Test(wgmma, sw128_loader_tail) { test_sw128_layout(1, TEST_SW_N); }
Test(wgmma, sw128_loader_whole) { test_sw128_layout(1, TEST_SW_ROWS); }

/* ---- wgmma against the CPU ---- */

/* How B (K x N) lies in shared memory, and so TRANS_B. */
enum { TEST_B_KMAJOR = 0, TEST_B_MNMAJOR = 1 };
/* How A reaches the tensor cores. */
enum { TEST_A_SMEM, TEST_A_REGS };

/* One warpgroup: C (64 x N, row-major fp32) = A (64 x K, row-major) * B + C0, with C0 = NaN and
 * FIRST_ACC = 0 testing the scale-d predicate. A and B are raw 16-bit patterns of T; B arrives
 * [N][K] when B_MAJOR is K-major, [K][N] when MN-major, and is loaded into shared memory as is. */
template <typename T, int A_FROM, int N, int K, int B_MAJOR, int FIRST_ACC>
static __global__ void __launch_bounds__(TEST_WG_THREADS) test_wgmma_kernel(const uint16_t *A, const uint16_t *B,
                                                                             const float *C0, float *C)
{
    constexpr int KSTEPS = K / 16;
    extern __shared__ __align__(1024) unsigned char smem[];
    T *sA = (T *)smem;                                  /* [64][K], K-major */
    T *sB = (T *)(smem + 2 * TEST_WG_M * K);            /* [N][K] or [K][N] */
    static_assert(2 * TEST_WG_M * K % SW128_ATOM_BYTES == 0, "B's tile starts 1024-byte aligned");
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;

    if (A_FROM == TEST_A_SMEM) load_tile_sw128<T, K, TEST_WG_M, TEST_WG_THREADS>(sA, (const T *)A, 0, TEST_WG_M);
    if (B_MAJOR == TEST_B_KMAJOR)
        load_tile_sw128<T, K, N, TEST_WG_THREADS>(sB, (const T *)B, 0, N);
    else
        load_tile_sw128<T, N, K, TEST_WG_THREADS>(sB, (const T *)B, 0, K);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_smem(); /* the copies, made through the generic proxy, before wgmma reads them */
    __syncthreads();          /* every thread's copies in place */

    /* D in the documented layout: row 16w + g (+8), columns 8nt + 2t (+1) */
    float d[N / 8][4];
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            d[nt][c] = C0[(16 * w + g + 8 * (c >> 1)) * N + 8 * nt + 2 * t + (c & 1)];

    const unsigned a_smem = (unsigned)__cvta_generic_to_shared(sA), b_smem = (unsigned)__cvta_generic_to_shared(sB);
    const uint64_t desc_a = wgmma_desc_kmajor(a_smem);
    const uint64_t desc_b = B_MAJOR == TEST_B_KMAJOR ? wgmma_desc_kmajor(b_smem)
                                                     : wgmma_desc_mnmajor(b_smem, K * SW128_ROW_BYTES);
    uint32_t a[KSTEPS][4] = {}; /* RS: A's fragments, the documented A layout, straight from global memory */
    if (A_FROM == TEST_A_REGS)
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = 16 * w + g + 8 * (i & 1), col = 16 * kk + 2 * t + 8 * (i >> 1);
                a[kk][i] = (uint32_t)A[row * K + col] | (uint32_t)A[row * K + col + 1] << 16;
            }

    wgmma_fence(); /* d and a written by ordinary instructions above */
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        const unsigned b_step = B_MAJOR == TEST_B_KMAJOR ? sw128_kmajor_step<N>(kk) : sw128_mnmajor_step(kk);
        const int accumulate = kk > 0 || FIRST_ACC;
        if constexpr (A_FROM == TEST_A_SMEM)
            wgmma_ss<T, N, B_MAJOR>(d, wgmma_desc_step(desc_a, sw128_kmajor_step<TEST_WG_M>(kk)),
                                    wgmma_desc_step(desc_b, b_step), accumulate);
        else
            wgmma_rs<T, N, B_MAJOR>(d, a[kk], wgmma_desc_step(desc_b, b_step), accumulate);
    }
    wgmma_commit();
    wgmma_wait<0>(); /* the tensor cores are done: d holds C, a is free */
    wgmma_hold(d);
    if constexpr (A_FROM == TEST_A_REGS) wgmma_hold(a);

#pragma unroll
    for (int nt = 0; nt < N / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++)
            C[(16 * w + g + 8 * (c >> 1)) * N + 8 * nt + 2 * t + (c & 1)] = d[nt][c];
}

/* A fixed sequence (no time seed): k/8 with k in [-32, 32], as test_mma.cu. */
static float test_eighth(uint32_t *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)((int)((*state >> 8) % 65u) - 32) / 8.0f;
}

template <typename T, int A_FROM, int N, int K, int B_MAJOR, int FIRST_ACC>
static void test_wgmma_run(const char *label, uint32_t seed)
{
    constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
    const int M = TEST_WG_M;
    std::vector<uint16_t> A(M * K), B(K * N);
    std::vector<float> Af(M * K), Bf(K * N), C0(M * N), C(M * N);
    std::vector<double> want(M * N);
    uint32_t s = seed;
    for (int i = 0; i < M * K; i++) {
        float x = test_eighth(&s);
        A[i] = BF16 ? f32_to_bf16(x) : f32_to_f16(x);
        Af[i] = BF16 ? bf16_to_f32(A[i]) : f16_to_f32(A[i]);
    }
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++) {
            float x = test_eighth(&s);
            uint16_t h = BF16 ? f32_to_bf16(x) : f32_to_f16(x);
            Bf[k * N + n] = BF16 ? bf16_to_f32(h) : f16_to_f32(h);
            B[B_MAJOR == TEST_B_KMAJOR ? n * K + k : k * N + n] = h; /* K-major: row n holds column n of B */
        }
    for (int i = 0; i < M * N; i++) C0[i] = FIRST_ACC ? test_eighth(&s) : NAN; /* NaN must not survive */
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = FIRST_ACC ? C0[m * N + n] : 0;
            for (int k = 0; k < K; k++) acc += (double)Af[m * K + k] * Bf[k * N + n];
            want[m * N + n] = acc;
        }

    uint16_t *dA, *dB;
    float *dC0, *dC;
    const size_t smem = 2 * (size_t)M * K + 2 * (size_t)K * N;
    CUDA_CHECK(cudaMalloc(&dA, A.size() * 2));
    CUDA_CHECK(cudaMalloc(&dB, B.size() * 2));
    CUDA_CHECK(cudaMalloc(&dC0, C0.size() * 4));
    CUDA_CHECK(cudaMalloc(&dC, C.size() * 4));
    CUDA_CHECK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dC0, C0.data(), C0.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dC, 0xff, C.size() * 4)); /* NaN: an element never written shows */
    auto kernel = test_wgmma_kernel<T, A_FROM, N, K, B_MAJOR, FIRST_ACC>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<1, TEST_WG_THREADS, smem>>>(dA, dB, dC0, dC);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    CUDA_CHECK(cudaFree(dC0));
    CUDA_CHECK(cudaFree(dC));

    int worst = 0, differ = 0;
    double worst_err = -1;
    for (int i = 0; i < M * N; i++) {
        double e = isnan(C[i]) ? INFINITY : fabs((double)C[i] - want[i]);
        if (e != 0) differ++;
        if (e > worst_err) worst_err = e, worst = i;
    }
    cr_assert(differ == 0, "%s: C[%d][%d] got %.9g want %.9g; %d of %d elements differ (exact required)", label,
              worst / N, worst % N, (double)C[worst], want[worst], differ, M * N);
}

/* name, dtype, A's source, N, K, B's layout, accumulate on the first step */
#define TEST_WGMMA(name, T, A_FROM, N, K, B_MAJOR, FIRST_ACC, seed)                                     \
    Test(wgmma, name)                                                                                   \
    {                                                                                                   \
        test_require_hopper();                                                                          \
        test_wgmma_run<T, A_FROM, N, K, B_MAJOR, FIRST_ACC>(                                            \
            "wgmma " #name " (m64n" #N "k16 x " #K "/16)", seed);                                       \
    }

TEST_WGMMA(ss_f16_n64_kmajor, __half, TEST_A_SMEM, 64, 64, TEST_B_KMAJOR, 1, 21)
TEST_WGMMA(ss_bf16_n64_kmajor, __nv_bfloat16, TEST_A_SMEM, 64, 64, TEST_B_KMAJOR, 1, 22)
TEST_WGMMA(ss_f16_n128_kmajor, __half, TEST_A_SMEM, 128, 128, TEST_B_KMAJOR, 1, 23)
TEST_WGMMA(ss_bf16_n128_kmajor, __nv_bfloat16, TEST_A_SMEM, 128, 128, TEST_B_KMAJOR, 1, 24)
TEST_WGMMA(ss_f16_n64_mnmajor, __half, TEST_A_SMEM, 64, 64, TEST_B_MNMAJOR, 1, 25)
TEST_WGMMA(ss_bf16_n64_mnmajor, __nv_bfloat16, TEST_A_SMEM, 64, 64, TEST_B_MNMAJOR, 1, 26)
TEST_WGMMA(ss_f16_first_step, __half, TEST_A_SMEM, 64, 128, TEST_B_KMAJOR, 0, 27)
TEST_WGMMA(ss_bf16_first_step, __nv_bfloat16, TEST_A_SMEM, 64, 128, TEST_B_KMAJOR, 0, 28)
TEST_WGMMA(rs_f16_n64_mnmajor, __half, TEST_A_REGS, 64, 128, TEST_B_MNMAJOR, 1, 31)
TEST_WGMMA(rs_bf16_n64_mnmajor, __nv_bfloat16, TEST_A_REGS, 64, 128, TEST_B_MNMAJOR, 1, 32)
TEST_WGMMA(rs_f16_n128_mnmajor, __half, TEST_A_REGS, 128, 128, TEST_B_MNMAJOR, 1, 33)
TEST_WGMMA(rs_bf16_n128_mnmajor, __nv_bfloat16, TEST_A_REGS, 128, 128, TEST_B_MNMAJOR, 1, 34)
TEST_WGMMA(rs_f16_n256_mnmajor, __half, TEST_A_REGS, 256, 64, TEST_B_MNMAJOR, 1, 35)
TEST_WGMMA(rs_bf16_n256_mnmajor, __nv_bfloat16, TEST_A_REGS, 256, 64, TEST_B_MNMAJOR, 1, 36)
TEST_WGMMA(rs_f16_n64_kmajor, __half, TEST_A_REGS, 64, 64, TEST_B_KMAJOR, 1, 37)
TEST_WGMMA(rs_bf16_n64_kmajor, __nv_bfloat16, TEST_A_REGS, 64, 64, TEST_B_KMAJOR, 1, 38)
