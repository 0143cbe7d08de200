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
 * wgmma::ss_{f16,bf16}_n64_a_mnmajor  the SS form with A MN-major too (stored [K][64], TRANS_A = 1),
 *                              as stage 16's dQ = dS K_j reads dS from its dS^T tile.
 * wgmma::e4m3_convert, {ss,rs}_e4m3_n{64,128}  FP8: at the end of the file.
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
/* How A reaches the tensor cores: shared memory K-major, registers, shared memory MN-major (stored
 * [K][64], read with TRANS_A = 1). */
enum { TEST_A_SMEM, TEST_A_REGS, TEST_A_SMEM_MN };

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
    if (A_FROM == TEST_A_SMEM_MN) load_tile_sw128<T, TEST_WG_M, K, TEST_WG_THREADS>(sA, (const T *)A, 0, K);
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
    const uint64_t desc_a = A_FROM == TEST_A_SMEM_MN ? wgmma_desc_mnmajor(a_smem, K * SW128_ROW_BYTES)
                                                     : wgmma_desc_kmajor(a_smem);
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
        else if constexpr (A_FROM == TEST_A_SMEM_MN)
            wgmma_ss<T, N, B_MAJOR, 1>(d, wgmma_desc_step(desc_a, sw128_mnmajor_step(kk)), wgmma_desc_step(desc_b, b_step),
                                       accumulate);
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

/* One warpgroup's run of `kernel` on the host's A, B (elements of E) and C0, with `smem` bytes of
 * dynamic shared memory: the upload, the launch and the download every wgmma test makes. C comes
 * back NaN wherever the kernel never wrote. */
template <typename E>
static void test_wg_launch(void (*kernel)(const E *, const E *, const float *, float *), const std::vector<E> &A,
                           const std::vector<E> &B, const std::vector<float> &C0, std::vector<float> &C, size_t smem)
{
    E *dA, *dB;
    float *dC0, *dC;
    CUDA_CHECK(cudaMalloc(&dA, A.size() * sizeof(E)));
    CUDA_CHECK(cudaMalloc(&dB, B.size() * sizeof(E)));
    CUDA_CHECK(cudaMalloc(&dC0, C0.size() * 4));
    CUDA_CHECK(cudaMalloc(&dC, C.size() * 4));
    CUDA_CHECK(cudaMemcpy(dA, A.data(), A.size() * sizeof(E), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dB, B.data(), B.size() * sizeof(E), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dC0, C0.data(), C0.size() * 4, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dC, 0xff, C.size() * 4)); /* NaN: an element never written shows */
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<1, TEST_WG_THREADS, smem>>>(dA, dB, dC0, dC);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(C.data(), dC, C.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    CUDA_CHECK(cudaFree(dC0));
    CUDA_CHECK(cudaFree(dC));
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
        const uint16_t h = BF16 ? f32_to_bf16(x) : f32_to_f16(x);
        Af[i] = BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        A[A_FROM == TEST_A_SMEM_MN ? (i % K) * M + i / K : i] = h; /* MN-major: row k holds column k of A */
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

    test_wg_launch(test_wgmma_kernel<T, A_FROM, N, K, B_MAJOR, FIRST_ACC>, A, B, C0, C,
                   2 * (size_t)M * K + 2 * (size_t)K * N);

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
/* A MN-major (TRANS_A), B MN-major: stage 16's dQ = dS K_j, dS read from the dS^T tile */
TEST_WGMMA(ss_f16_n64_a_mnmajor, __half, TEST_A_SMEM_MN, 64, 128, TEST_B_MNMAJOR, 1, 39)
TEST_WGMMA(ss_bf16_n64_a_mnmajor, __nv_bfloat16, TEST_A_SMEM_MN, 64, 128, TEST_B_MNMAJOR, 1, 40)

/* ---- FP8 e4m3 ----
 *
 * wgmma::e4m3_convert        pack_e4m3x4 (the GPU's cvt.rn.satfinite.e4m3x2.f32) against the host's
 *                            f32_to_e4m3, bit for bit: every e4m3 value, the midpoints between
 *                            neighbours (ties to even), just past them, and past 448.
 * wgmma::ss_e4m3_n{64,128}, rs_e4m3_n{64,128}  C = A * B + C0 with m64nNk32 e4m3 wgmma, A and B
 *                            K-major in the 128-byte swizzle (a 128-byte row holds 128 elements),
 *                            A from shared memory or from registers in the documented 8-bit A
 *                            layout. Inputs are multiples of 1/8 in [-15/8, 15/8], exact in e4m3;
 *                            with K <= 256 every partial sum is a multiple of 1/64 below 2^10: exact
 *                            in fp32, so the results must equal the fp64 product exactly. */

static __global__ void test_e4m3_convert_kernel(const float *x, uint32_t *out, int n4)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n4) out[i] = pack_e4m3x4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
}

Test(wgmma, e4m3_convert)
{
    test_require_hopper();
    std::vector<float> x;
    for (int c = 0; c <= 0x7e; c++) {
        const float v = e4m3_to_f32((uint8_t)c);
        x.push_back(v), x.push_back(-v);
        const float next = c < 0x7e ? e4m3_to_f32((uint8_t)(c + 1)) : 480.0f; /* 480: where 448's rounding ends */
        const float mid = (v + next) / 2;
        x.push_back(mid), x.push_back(-mid), x.push_back(nextafterf(mid, INFINITY)), x.push_back(nextafterf(mid, 0.0f));
    }
    for (float big : {449.0f, 470.0f, 1e6f, 1e30f, INFINITY}) x.push_back(big), x.push_back(-big);
    while (x.size() % 4) x.push_back(0.0f);
    const int n4 = (int)x.size() / 4;
    float *dx;
    uint32_t *dout;
    CUDA_CHECK(cudaMalloc(&dx, x.size() * 4));
    CUDA_CHECK(cudaMalloc(&dout, n4 * 4));
    CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));
    test_e4m3_convert_kernel<<<(n4 + 127) / 128, 128>>>(dx, dout, n4);
    LAUNCH_CHECK();
    std::vector<uint32_t> out(n4);
    CUDA_CHECK(cudaMemcpy(out.data(), dout, n4 * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dx));
    CUDA_CHECK(cudaFree(dout));
    int differ = 0, first = -1;
    for (size_t i = 0; i < x.size(); i++) {
        const uint8_t got = (uint8_t)(out[i / 4] >> (8 * (i % 4))), want = f32_to_e4m3(x[i]);
        if (got != want && !differ++) first = (int)i;
    }
    cr_assert(differ == 0, "e4m3: %d of %zu values differ from the host's conversion; the first, %.9g: GPU 0x%02x, "
              "host 0x%02x", differ, x.size(), first >= 0 ? (double)x[first] : 0.0,
              first >= 0 ? (unsigned)(uint8_t)(out[first / 4] >> (8 * (first % 4))) : 0u,
              first >= 0 ? (unsigned)f32_to_e4m3(x[first]) : 0u);
}

/* One warpgroup: C (64 x N) = A (64 x K, bytes, row-major) * B + C0, B given [N][K] (K-major). */
template <int A_FROM, int N, int K>
static __global__ void __launch_bounds__(TEST_WG_THREADS) test_wgmma_e4m3_kernel(const uint8_t *A, const uint8_t *B,
                                                                                  const float *C0, float *C)
{
    constexpr int KSTEPS = K / 32;
    static_assert(K % 128 == 0, "whole 128-byte rows: the loader moves them as 64 16-bit pairs");
    extern __shared__ __align__(1024) unsigned char smem[];
    uint16_t *sA = (uint16_t *)smem, *sB = (uint16_t *)(smem + TEST_WG_M * K); /* byte pairs */
    const int tid = threadIdx.x, w = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
    if (A_FROM == TEST_A_SMEM) load_tile_sw128<uint16_t, K / 2, TEST_WG_M, TEST_WG_THREADS>(sA, (const uint16_t *)A, 0, TEST_WG_M);
    load_tile_sw128<uint16_t, K / 2, N, TEST_WG_THREADS>(sB, (const uint16_t *)B, 0, N);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_smem();
    __syncthreads();

    float d[N / 8][4];
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) d[nt][c] = C0[(16 * w + g + 8 * (c >> 1)) * N + 8 * nt + 2 * t + (c & 1)];
    const uint64_t desc_a = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(sA));
    const uint64_t desc_b = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(sB));
    uint32_t a[KSTEPS][4] = {}; /* the documented 8-bit A layout, straight from global memory */
    if (A_FROM == TEST_A_REGS)
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int row = 16 * w + g + 8 * (i & 1), col = 32 * kk + 4 * t + 16 * (i >> 1);
                a[kk][i] = *(const uint32_t *)&A[row * K + col];
            }
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        const uint64_t b = wgmma_desc_step(desc_b, sw128_kmajor_step<N>(kk));
        if constexpr (A_FROM == TEST_A_SMEM)
            wgmma_ss_e4m3<N>(d, wgmma_desc_step(desc_a, sw128_kmajor_step<TEST_WG_M>(kk)), b, 1);
        else
            wgmma_rs_e4m3<N>(d, a[kk], b, 1);
    }
    wgmma_commit();
    wgmma_wait<0>();
    wgmma_hold(d);
    if constexpr (A_FROM == TEST_A_REGS) wgmma_hold(a);
#pragma unroll
    for (int nt = 0; nt < N / 8; nt++)
#pragma unroll
        for (int c = 0; c < 4; c++) C[(16 * w + g + 8 * (c >> 1)) * N + 8 * nt + 2 * t + (c & 1)] = d[nt][c];
}

/* k/8 with k in [-15, 15]: exact in e4m3 (three mantissa bits) */
static float test_eighth15(uint32_t *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)((int)((*state >> 8) % 31u) - 15) / 8.0f;
}

template <int A_FROM, int N, int K>
static void test_wgmma_e4m3_run(const char *label, uint32_t seed)
{
    const int M = TEST_WG_M;
    std::vector<uint8_t> A(M * K), B(N * K);
    std::vector<float> Af(M * K), Bf(N * K), C0(M * N), C(M * N);
    uint32_t s = seed;
    for (int i = 0; i < M * K; i++) Af[i] = test_eighth15(&s), A[i] = f32_to_e4m3(Af[i]);
    for (int i = 0; i < N * K; i++) Bf[i] = test_eighth15(&s), B[i] = f32_to_e4m3(Bf[i]); /* B[n][k] */
    for (int i = 0; i < M * N; i++) C0[i] = test_eighth15(&s);
    for (int i = 0; i < M * K; i++) cr_assert(e4m3_to_f32(A[i]) == Af[i], "%s: %g is not exact in e4m3", label, Af[i]);
    test_wg_launch(test_wgmma_e4m3_kernel<A_FROM, N, K>, A, B, C0, C, (size_t)M * K + (size_t)N * K);
    int differ = 0, worst = 0;
    double worst_err = -1;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double want = C0[m * N + n];
            for (int k = 0; k < K; k++) want += (double)Af[m * K + k] * Bf[n * K + k];
            const double e = isnan(C[m * N + n]) ? INFINITY : fabs((double)C[m * N + n] - want);
            if (e != 0) differ++;
            if (e > worst_err) worst_err = e, worst = m * N + n;
        }
    cr_assert(differ == 0, "%s: C[%d][%d] off by %g; %d of %d elements differ (exact required)", label, worst / N,
              worst % N, worst_err, differ, M * N);
}

#define TEST_WGMMA_E4M3(name, A_FROM, N, K, seed)                                                       \
    Test(wgmma, name)                                                                                   \
    {                                                                                                   \
        test_require_hopper();                                                                          \
        test_wgmma_e4m3_run<A_FROM, N, K>("wgmma " #name " (m64n" #N "k32 e4m3 x " #K "/32)", seed);    \
    }

TEST_WGMMA_E4M3(ss_e4m3_n64, TEST_A_SMEM, 64, 128, 51)
TEST_WGMMA_E4M3(ss_e4m3_n128, TEST_A_SMEM, 128, 256, 52)
TEST_WGMMA_E4M3(rs_e4m3_n64, TEST_A_REGS, 64, 128, 53)
TEST_WGMMA_E4M3(rs_e4m3_n128, TEST_A_REGS, 128, 256, 54)
TEST_WGMMA_E4M3(rs_e4m3_n256, TEST_A_REGS, 256, 128, 55) /* stage 19's P V at d = 256 */
