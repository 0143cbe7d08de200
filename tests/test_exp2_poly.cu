/* test_exp2_poly.cu: common/cuda/exp2_poly.cuh, the exponential stage 18 computes on the FMA pipe.
 *
 * exp2_poly::against_fp64      on the CPU, [-125.5, 8] on a grid of 2^-12: the largest relative
 *                              error against exp2 in fp64, printed in units of fp32's ulp and of
 *                              fp16's and bf16's half ulp, asserted under 1e-4 (the fit's 7.5e-5
 *                              plus the float rounding of its steps); below -125.5, at -inf and at
 *                              -1000, exactly 0.
 * exp2_poly::against_mufu      on the GPU, the same grid through exp2_poly and through the
 *                              hardware's ex2.approx.ftz (exp2_approx): the largest relative
 *                              difference, printed, asserted under 1e-4; skips without a device.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
extern "C" {
#include "tests/common_test.h"
}
#include "common/cuda/cuda_check.h"
#include "common/cuda/exp2_poly.cuh"
#include "common/cuda/mma.cuh"

#include <math.h>

#define TEST_EXP2_LO -125.5
#define TEST_EXP2_HI 8.0
#define TEST_EXP2_STEP (1.0 / 4096) /* 2^-12: 546817 points */
#define TEST_EXP2_POINTS ((int)((TEST_EXP2_HI - TEST_EXP2_LO) / TEST_EXP2_STEP) + 1)

static __host__ __device__ float test_exp2_x(int i) { return (float)(TEST_EXP2_LO + i * TEST_EXP2_STEP); }

Test(exp2_poly, against_fp64)
{
    double worst = 0, at = 0;
    for (int i = 0; i < TEST_EXP2_POINTS; i++) {
        const float x = test_exp2_x(i);
        const double want = exp2((double)x), err = fabs((double)exp2_poly(x) - want) / want;
        if (err > worst) worst = err, at = x;
    }
    printf("exp2_poly against fp64 on [-125.5, 8]: worst relative error %.3e at x = %.6f: %.1f fp32 ulps, "
           "%.3f of fp16's half ulp, %.4f of bf16's\n", worst, at, worst / ldexp(1, -23), worst / ldexp(1, -11),
           worst / ldexp(1, -8));
    cr_assert(worst < 1e-4, "exp2_poly: relative error %.3e at x = %g, over 1e-4", worst, at);
    cr_assert(exp2_poly(-125.6f) == 0.f && exp2_poly(-1000.f) == 0.f && exp2_poly(-INFINITY) == 0.f,
              "exp2_poly: not 0 below -125.5 (%g %g %g)", exp2_poly(-125.6f), exp2_poly(-1000.f), exp2_poly(-INFINITY));
}

__global__ void test_exp2_kernel(float *poly, float *mufu, int n)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const float x = test_exp2_x(i);
        poly[i] = exp2_poly(x), mufu[i] = exp2_approx(x);
    }
}

Test(exp2_poly, against_mufu)
{
    test_require_gpu();
    const int n = TEST_EXP2_POINTS;
    float *d_poly, *d_mufu;
    CUDA_CHECK(cudaMalloc(&d_poly, n * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&d_mufu, n * sizeof(float)));
    test_exp2_kernel<<<(n + 255) / 256, 256>>>(d_poly, d_mufu, n);
    CUDA_CHECK(cudaGetLastError());
    float *poly = test_floats(n), *mufu = test_floats(n);
    CUDA_CHECK(cudaMemcpy(poly, d_poly, n * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(mufu, d_mufu, n * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0, at = 0;
    for (int i = 0; i < n; i++) {
        if (mufu[i] == 0.f) { /* the hardware flushed it: so must the polynomial, within a step */
            cr_assert(poly[i] < 2.5e-38f, "x = %g: ex2.approx gives 0, exp2_poly %g", test_exp2_x(i), poly[i]);
            continue;
        }
        const double err = fabs((double)poly[i] - mufu[i]) / mufu[i];
        if (err > worst) worst = err, at = test_exp2_x(i);
    }
    printf("exp2_poly against ex2.approx on [-125.5, 8]: worst relative difference %.3e at x = %.6f\n", worst, at);
    cr_assert(worst < 1e-4, "exp2_poly against ex2.approx: %.3e at x = %g, over 1e-4", worst, at);
    free(poly), free(mufu);
    CUDA_CHECK(cudaFree(d_poly));
    CUDA_CHECK(cudaFree(d_mufu));
}
