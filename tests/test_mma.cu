/* test_mma.cu: the inline-PTX helpers of common/cuda/mma.cuh on the GPU, against the CPU.
 *
 * mma::f16_b_nmajor_x2         one warp, C = A * B + C0 (16x16 * 16x8): A through ldmatrix_x4
 * mma::bf16_b_nmajor_x2        from a row-major tile, B through ldmatrix_x2 from B^T stored
 *                              n-major (8 rows of 16 k), C written in the documented C layout.
 * mma::f16_b_kmajor_x2_trans   the same with B stored k-major (16 rows of 8 n) and read with
 * mma::bf16_b_kmajor_x2_trans  ldmatrix_x2_trans.
 * mma::f16_b_kmajor_x4_trans   16x16 * 16x16: B stored k-major (16 rows of 16 n), one
 * mma::bf16_b_kmajor_x4_trans  ldmatrix_x4_trans for both n8 tiles, two mma per warp.
 * mma::cp_async                64 rows of 16 bytes global -> shared -> global through cp_async_16
 *                              and cp_async_16_zfill (valid and not), two commit groups per
 *                              thread, cp_async_wait<0>; zero-filled rows must come back zero
 *                              over a nonzero pre-fill of shared memory.
 * mma::pack_half2              the register pack_half2 / pack_bf162 build: the first argument
 * mma::pack_bf162              in the low 16 bits, bit-exact with the host conversions.
 *
 * Exactness: every mma input is a multiple of 1/8 in [-4, 4] (k/8 with |k| <= 32: at most 6
 * significant bits, exact in fp16 and in bf16), and so is C0. Each product is then a multiple
 * of 1/64 of magnitude <= 16, and every partial sum of 16 of them plus C0 a multiple of 1/64 of
 * magnitude <= 260: at most 15 significant bits, exact in fp32 in any order of summation and
 * under any alignment width the tensor core uses (>= 24 bits). The fp64 CPU sum of the same
 * inputs is that same number, so the mma results must equal it exactly: any difference is a
 * fragment-layout bug, not rounding.
 *
 * Built for Turing (sm_75, or a compute_75 PTX build on any GPU) the same tests check Turing's
 * side of mma.cuh: the f16 m16n8k16 as two m16n8k8, cp.async as plain loads and stores.
 *
 * Each test skips with a one-line reason where there is no CUDA device, and the bf16 ones where
 * the code running is Turing's; CUDA is touched only inside the test bodies (Criterion runs each
 * in a child process).
 */
/* common_test.h declares C functions without extern "C", so it is included inside a block of
 * it; the C++ headers it pulls in (Criterion's) are included first, outside, so that the second
 * inclusion in the block is an empty include-guarded one. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
extern "C" {
#include "tests/common_test.h"
}
#include "common/cuda/cuda_check.h"
#include "common/cuda/mma.cuh"
#include "common/half.h"

#include <math.h>
#include <string.h>

/* bf16 mma needs sm_80 code: where the code running is Turing's (a T4, or a compute_75 build on
 * a newer GPU) its helper traps, and the runner refuses bf16 (gpu_dtype_check). */
static void test_require_bf16(void)
{
    char why[256];
    test_require_gpu();
    if (gpu_dtype_check(DT_BF16, "the bf16 mma tests", why, sizeof why)) cr_skip_test("%s", why);
}

/* ---- mma.sync m16n8k16 with ldmatrix-loaded fragments ---- */

/* How B (16 x N, K x N) lies in shared memory and which ldmatrix reads it. */
enum test_b_layout {
    TEST_B_NMAJOR_X2,   /* B^T row-major: 8 rows (n) of 16 (k); ldmatrix_x2, N = 8 */
    TEST_B_KMAJOR_X2T,  /* B row-major: 16 rows (k) of 8 (n); ldmatrix_x2_trans, N = 8 */
    TEST_B_KMAJOR_X4T,  /* B row-major: 16 rows (k) of 16 (n); ldmatrix_x4_trans, N = 16 */
};

template <int LAYOUT>
struct test_b_shape {
    static constexpr int N = LAYOUT == TEST_B_KMAJOR_X4T ? 16 : 8; /* columns of B and C */
};

/* One warp: C (16 x N, row-major fp32) = A (16 x 16, row-major) * B + C0, A and B as raw 16-bit
 * patterns of fp16 (BF16 false) or bf16 (BF16 true), B stored as LAYOUT says. */
template <bool BF16, int LAYOUT>
static __global__ void test_mma_kernel(const uint16_t *A, const uint16_t *Bs, const float *C0, float *C)
{
    constexpr int N = test_b_shape<LAYOUT>::N;
    __shared__ __align__(16) uint16_t sA[16 * 16];
    __shared__ __align__(16) uint16_t sB[16 * N];
    const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
    for (int i = lane; i < 16 * 16; i += 32) sA[i] = A[i];
    for (int i = lane; i < 16 * N; i += 32) sB[i] = Bs[i];
    __syncthreads();

    /* A: lanes 0-7 rows 0-7 of columns 0-7 (a[0]), lanes 8-15 rows 8-15 (a[1]), lanes 16-23
     * rows 0-7 of columns 8-15 (a[2]), lanes 24-31 rows 8-15 (a[3]). */
    uint32_t a[4];
    ldmatrix_x4(a, &sA[(lane % 16) * 16 + (lane / 16) * 8]);

    uint32_t b[N / 8][2]; /* b[j]: the fragment of n8 tile j (columns 8j .. 8j+7) */
    if constexpr (LAYOUT == TEST_B_NMAJOR_X2) {
        /* matrix 0 = B^T[0:8][k 0:8] (b[0]), matrix 1 = B^T[0:8][k 8:16] (b[1]); lanes 16-31
         * are not read, their (in-range) addresses repeat lanes 0-15. */
        ldmatrix_x2(b[0], &sB[(lane % 8) * 16 + (lane / 8 % 2) * 8]);
    } else if constexpr (LAYOUT == TEST_B_KMAJOR_X2T) {
        /* matrix 0 = B[k 0:8][0:8], matrix 1 = B[k 8:16][0:8], transposed on the way in */
        ldmatrix_x2_trans(b[0], &sB[(lane % 16) * 8]);
    } else {
        /* matrices 0, 1 = B[k 0:8], B[k 8:16] of columns 0-7; matrices 2, 3 the same of 8-15 */
        uint32_t r[4];
        ldmatrix_x4_trans(r, &sB[(lane % 16) * 16 + (lane / 16) * 8]);
        b[0][0] = r[0], b[0][1] = r[1], b[1][0] = r[2], b[1][1] = r[3];
    }

    for (int j = 0; j < N / 8; j++) {
        const int col = 8 * j + 2 * t;
        float c[4] = {C0[g * N + col], C0[g * N + col + 1], C0[(g + 8) * N + col], C0[(g + 8) * N + col + 1]};
        if constexpr (BF16)
            mma_m16n8k16_bf16(c, a, b[j]);
        else
            mma_m16n8k16_f16(c, a, b[j]);
        C[g * N + col] = c[0], C[g * N + col + 1] = c[1];
        C[(g + 8) * N + col] = c[2], C[(g + 8) * N + col + 1] = c[3];
    }
}

/* A fixed sequence (no time seed): k/8 with k in [-32, 32]. */
static float test_eighth(uint32_t *state)
{
    *state = *state * 1664525u + 1013904223u;
    return (float)((int)((*state >> 8) % 65u) - 32) / 8.0f;
}

/* One assert for a whole fp32 matrix (rows x cols) that must equal want exactly; the message
 * names the worst element (NaN counts as the worst: the output was pre-filled with NaN). */
static void test_assert_exact(const char *label, const float *got, const double *want, int rows, int cols)
{
    int worst = 0, differ = 0;
    double worst_err = -1;
    for (int i = 0; i < rows * cols; i++) {
        double e = isnan(got[i]) ? INFINITY : fabs((double)got[i] - want[i]);
        if (e != 0) differ++;
        if (e > worst_err) worst_err = e, worst = i;
    }
    cr_assert(differ == 0, "%s: C[%d][%d] (element %d) got %.9g want %.9g; %d of %d elements differ (exact required)",
              label, worst / cols, worst % cols, worst, (double)got[worst], want[worst], differ, rows * cols);
}

template <bool BF16, int LAYOUT>
static void test_mma_run(const char *label, uint32_t seed)
{
    constexpr int N = test_b_shape<LAYOUT>::N;
    uint16_t A[16 * 16], Bs[16 * N];
    float Bm[16][N], Af[16 * 16], C0[16 * N], C[16 * N];
    double want[16 * N];

    /* inputs: exact in either dtype (see the top of the file), stored as raw 16-bit patterns */
    uint32_t s = seed;
    for (int i = 0; i < 16 * 16; i++) {
        float x = test_eighth(&s);
        A[i] = BF16 ? f32_to_bf16(x) : f32_to_f16(x);
        Af[i] = BF16 ? bf16_to_f32(A[i]) : f16_to_f32(A[i]);
    }
    for (int k = 0; k < 16; k++)
        for (int n = 0; n < N; n++) {
            float x = test_eighth(&s);
            uint16_t h = BF16 ? f32_to_bf16(x) : f32_to_f16(x);
            Bm[k][n] = BF16 ? bf16_to_f32(h) : f16_to_f32(h);
            if (LAYOUT == TEST_B_NMAJOR_X2)
                Bs[n * 16 + k] = h; /* B^T: row n holds column n of B */
            else
                Bs[k * N + n] = h;
        }
    for (int i = 0; i < 16 * N; i++) C0[i] = test_eighth(&s);

    /* the CPU product in fp64 */
    for (int m = 0; m < 16; m++)
        for (int n = 0; n < N; n++) {
            double acc = C0[m * N + n];
            for (int k = 0; k < 16; k++) acc += (double)Af[m * 16 + k] * Bm[k][n];
            want[m * N + n] = acc;
        }

    uint16_t *dA, *dB;
    float *dC0, *dC;
    CUDA_CHECK(cudaMalloc(&dA, sizeof A));
    CUDA_CHECK(cudaMalloc(&dB, sizeof Bs));
    CUDA_CHECK(cudaMalloc(&dC0, sizeof C0));
    CUDA_CHECK(cudaMalloc(&dC, sizeof C));
    CUDA_CHECK(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dB, Bs, sizeof Bs, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dC0, C0, sizeof C0, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dC, 0xff, sizeof C)); /* NaN: an element never written shows */
    test_mma_kernel<BF16, LAYOUT><<<1, 32>>>(dA, dB, dC0, dC);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(C, dC, sizeof C, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dA));
    CUDA_CHECK(cudaFree(dB));
    CUDA_CHECK(cudaFree(dC0));
    CUDA_CHECK(cudaFree(dC));

    test_assert_exact(label, C, want, 16, N);
}

Test(mma, f16_b_nmajor_x2)
{
    test_require_gpu();
    test_mma_run<false, TEST_B_NMAJOR_X2>("mma f16, B n-major via ldmatrix_x2", 11);
}

Test(mma, bf16_b_nmajor_x2)
{
    test_require_bf16();
    test_mma_run<true, TEST_B_NMAJOR_X2>("mma bf16, B n-major via ldmatrix_x2", 12);
}

Test(mma, f16_b_kmajor_x2_trans)
{
    test_require_gpu();
    test_mma_run<false, TEST_B_KMAJOR_X2T>("mma f16, B k-major via ldmatrix_x2_trans", 13);
}

Test(mma, bf16_b_kmajor_x2_trans)
{
    test_require_bf16();
    test_mma_run<true, TEST_B_KMAJOR_X2T>("mma bf16, B k-major via ldmatrix_x2_trans", 14);
}

Test(mma, f16_b_kmajor_x4_trans)
{
    test_require_gpu();
    test_mma_run<false, TEST_B_KMAJOR_X4T>("mma f16, B k-major 16x16 via ldmatrix_x4_trans", 15);
}

Test(mma, bf16_b_kmajor_x4_trans)
{
    test_require_bf16();
    test_mma_run<true, TEST_B_KMAJOR_X4T>("mma bf16, B k-major 16x16 via ldmatrix_x4_trans", 16);
}

/* ---- cp.async ---- */

#define TEST_CP_ROWS 64     /* 16-byte rows: each of the 32 threads copies two, one per group */
#define TEST_CP_FILL 0xA5u  /* shared memory's pre-fill byte: a zero row must come from zfill */

enum test_cp_mode { TEST_CP_PLAIN, TEST_CP_ZFILL_VALID, TEST_CP_ZFILL_INVALID };
static const char *const test_cp_mode_name[] = {"cp_async_16", "cp_async_16_zfill valid", "cp_async_16_zfill !valid"};

/* Row r goes global src -> shared by the mode mode[r] says; thread tid issues rows tid and
 * tid + 32 in two commit groups, waits for all of them (cp_async_wait<0>), and after the barrier
 * writes out rows another thread copied (31 - tid, 63 - tid). */
static __global__ void test_cp_async_kernel(const uint4 *src, const int *mode, uint4 *dst)
{
    __shared__ uint4 s[TEST_CP_ROWS];
    const int tid = threadIdx.x;
    const unsigned fill = TEST_CP_FILL * 0x01010101u;
    for (int r = tid; r < TEST_CP_ROWS; r += 32) s[r] = make_uint4(fill, fill, fill, fill);
    __syncthreads();

    for (int r = tid; r < TEST_CP_ROWS; r += 32) {
        if (mode[r] == TEST_CP_PLAIN)
            cp_async_16(&s[r], &src[r]);
        else if (mode[r] == TEST_CP_ZFILL_VALID)
            cp_async_16_zfill(&s[r], &src[r], true);
        else
            cp_async_16_zfill(&s[r], &src[0], false); /* a valid address that must not be read */
        cp_async_commit();
    }
    cp_async_wait<0>();
    __syncthreads();

    for (int r = 31 - tid; r < TEST_CP_ROWS; r += 32) dst[r] = s[r];
}

Test(mma, cp_async)
{
    test_require_gpu();
    enum { BYTES = TEST_CP_ROWS * 16 };
    uint8_t src[BYTES], want[BYTES], got[BYTES];
    int mode[TEST_CP_ROWS];
    for (int r = 0; r < TEST_CP_ROWS; r++) {
        mode[r] = r % 3; /* every mode in both commit groups and in every position of a warp */
        for (int j = 0; j < 16; j++) {
            int i = r * 16 + j;
            src[i] = (uint8_t)(1 + (i * 37) % 251); /* never 0: a zero in the output is zfill's */
            want[i] = mode[r] == TEST_CP_ZFILL_INVALID ? 0 : src[i];
        }
    }

    uint4 *dsrc, *ddst;
    int *dmode;
    CUDA_CHECK(cudaMalloc(&dsrc, BYTES));
    CUDA_CHECK(cudaMalloc(&ddst, BYTES));
    CUDA_CHECK(cudaMalloc(&dmode, sizeof mode));
    CUDA_CHECK(cudaMemcpy(dsrc, src, BYTES, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dmode, mode, sizeof mode, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(ddst, 0x5a, BYTES)); /* a row never written shows */
    test_cp_async_kernel<<<1, 32>>>(dsrc, dmode, ddst);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got, ddst, BYTES, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dsrc));
    CUDA_CHECK(cudaFree(ddst));
    CUDA_CHECK(cudaFree(dmode));

    int first = -1, differ = 0;
    for (int i = 0; i < BYTES; i++)
        if (got[i] != want[i]) {
            if (first < 0) first = i;
            differ++;
        }
    int r = first < 0 ? 0 : first / 16, j = first < 0 ? 0 : first % 16;
    cr_assert(differ == 0, "cp.async: row %d (%s) byte %d got 0x%02x want 0x%02x; %d of %d bytes differ", r,
              test_cp_mode_name[mode[r]], j, got[r * 16 + j], want[r * 16 + j], differ, (int)BYTES);
}

/* ---- pack_half2 / pack_bf162 ---- */

/* Exact values, values that round (ties to even on both sides), and +0 / -0 in one pair. */
static const float test_pack_lo[] = {1.0f, -3.0f, 0.0f, 0.1f, 1.0f / 3.0f, 65504.0f, 1e-3f, -2.75f};
static const float test_pack_hi[] = {2.0f, 0.5f, -0.0f, -7.0f, 1e4f, -2.7f, 0.0f, 123.456f};
#define TEST_PACK_N ((int)TEST_COUNT(test_pack_lo))

template <bool BF16>
static __global__ void test_pack_kernel(const float *lo, const float *hi, uint32_t *out, int n)
{
    int i = threadIdx.x;
    if (i < n) out[i] = BF16 ? pack_bf162(lo[i], hi[i]) : pack_half2(lo[i], hi[i]);
}

template <bool BF16>
static void test_pack_run(const char *what)
{
    static_assert(TEST_COUNT(test_pack_lo) == TEST_COUNT(test_pack_hi), "one hi per lo");
    uint32_t got[TEST_PACK_N], want[TEST_PACK_N];
    for (int i = 0; i < TEST_PACK_N; i++) {
        uint16_t lo = BF16 ? f32_to_bf16(test_pack_lo[i]) : f32_to_f16(test_pack_lo[i]);
        uint16_t hi = BF16 ? f32_to_bf16(test_pack_hi[i]) : f32_to_f16(test_pack_hi[i]);
        want[i] = (uint32_t)lo | (uint32_t)hi << 16; /* the first argument in the low half */
    }

    float *dlo, *dhi;
    uint32_t *dout;
    CUDA_CHECK(cudaMalloc(&dlo, sizeof test_pack_lo));
    CUDA_CHECK(cudaMalloc(&dhi, sizeof test_pack_hi));
    CUDA_CHECK(cudaMalloc(&dout, sizeof got));
    CUDA_CHECK(cudaMemcpy(dlo, test_pack_lo, sizeof test_pack_lo, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dhi, test_pack_hi, sizeof test_pack_hi, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dout, 0, sizeof got));
    test_pack_kernel<BF16><<<1, 32>>>(dlo, dhi, dout, TEST_PACK_N);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dlo));
    CUDA_CHECK(cudaFree(dhi));
    CUDA_CHECK(cudaFree(dout));

    int first = -1, differ = 0;
    for (int i = 0; i < TEST_PACK_N; i++)
        if (got[i] != want[i]) {
            if (first < 0) first = i;
            differ++;
        }
    int i = first < 0 ? 0 : first;
    cr_assert(differ == 0, "%s(%.9g, %.9g) [element %d] got 0x%08x want 0x%08x (lo = first argument); %d of %d differ",
              what, (double)test_pack_lo[i], (double)test_pack_hi[i], i, got[i], want[i], differ, TEST_PACK_N);
}

Test(mma, pack_half2)
{
    test_require_gpu();
    test_pack_run<false>("pack_half2");
}

Test(mma, pack_bf162)
{
    test_require_gpu();
    test_pack_run<true>("pack_bf162");
}
