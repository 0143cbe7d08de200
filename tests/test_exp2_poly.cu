/* test_exp2_poly.cu: common/cuda/exp2_poly.cuh, the exponential stage 18 computes on the FMA pipe.
 *
 * exp2_poly::against_fp64      on the CPU: every f on a grid of 2^-24 in [-1/2, 1/2] (the
 *                              polynomial's whole input, j = 0), then [-125.5, 8] on a grid of
 *                              2^-12 (the exponent's path): the largest relative error against
 *                              exp2 in fp64, printed in units of fp32's unit roundoff (2^-24),
 *                              in ulps of fp32 at 1 (2^-23) and in fp16's and bf16's half ulps,
 *                              asserted under 2.5e-7 (the fit's 1.87e-7 with its float rounding,
 *                              and a margin); below -125.5, at -inf and at -1000, exactly 0.
 * exp2_poly::against_mufu      on the GPU, the [-125.5, 8] grid through exp2_poly and through the
 *                              hardware's ex2.approx.ftz (exp2_approx): the device's exp2_poly
 *                              asserted bit for bit equal to the host's (no contraction or
 *                              reordering by nvcc), and the largest relative difference from
 *                              MUFU printed and asserted under 1e-6 (the two errors, each a few
 *                              units of 2^-24, added); skips without a device.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdio.h>
#include <string.h>
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
#define TEST_EXP2_FRAC_BITS 24 /* f = k 2^-24, |f| <= 1/2: 2^24 + 1 points */
#define TEST_EXP2_MAX_REL 2.5e-7
#define TEST_EXP2_MAX_VS_MUFU 1e-6

static __host__ __device__ float test_exp2_x(int i) { return (float)(TEST_EXP2_LO + i * TEST_EXP2_STEP); }

static double test_exp2_rel(float x)
{
    const double want = exp2((double)x);
    return fabs((double)exp2_poly(x) - want) / want;
}

Test(exp2_poly, against_fp64)
{
    double worst = 0, at = 0;
    const long half = 1L << (TEST_EXP2_FRAC_BITS - 1);
    for (long k = -half; k <= half; k++) {
        const float f = (float)ldexp((double)k, -TEST_EXP2_FRAC_BITS);
        const double err = test_exp2_rel(f);
        if (err > worst) worst = err, at = f;
    }
    double worst_x = 0, at_x = 0;
    for (int i = 0; i < TEST_EXP2_POINTS; i++) {
        const float x = test_exp2_x(i);
        const double err = test_exp2_rel(x);
        if (err > worst_x) worst_x = err, at_x = x;
    }
    printf("exp2_poly against fp64, every f = k 2^-24 in [-1/2, 1/2]: worst relative error %.3e at f = %.7f: "
           "%.2f units of 2^-24, %.2f fp32 ulps at 1, %.5f of fp16's half ulp, %.6f of bf16's\n",
           worst, at, worst / ldexp(1, -24), worst / ldexp(1, -23), worst / ldexp(1, -11), worst / ldexp(1, -8));
    printf("exp2_poly against fp64, x on [-125.5, 8] by 2^-12: worst relative error %.3e at x = %.6f\n", worst_x, at_x);
    cr_assert(worst < TEST_EXP2_MAX_REL, "exp2_poly: relative error %.3e at f = %g, over %g", worst, at, TEST_EXP2_MAX_REL);
    cr_assert(worst_x < TEST_EXP2_MAX_REL, "exp2_poly: relative error %.3e at x = %g, over %g", worst_x, at_x,
              TEST_EXP2_MAX_REL);
    cr_assert(exp2_poly(0.f) == 1.f, "exp2_poly(0) = %.9g, not 1", exp2_poly(0.f));
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
    int differ = 0;
    float first_x = 0, first_dev = 0, first_host = 0;
    for (int i = 0; i < n; i++) {
        const float host = exp2_poly(test_exp2_x(i));
        if (memcmp(&host, &poly[i], sizeof host) != 0 && !differ++)
            first_x = test_exp2_x(i), first_dev = poly[i], first_host = host;
        if (mufu[i] == 0.f) { /* the hardware flushed it: so must the polynomial, within a step */
            cr_assert(poly[i] < 2.5e-38f, "x = %g: ex2.approx gives 0, exp2_poly %g", test_exp2_x(i), poly[i]);
            continue;
        }
        const double err = fabs((double)poly[i] - mufu[i]) / mufu[i];
        if (err > worst) worst = err, at = test_exp2_x(i);
    }
    printf("exp2_poly against ex2.approx on [-125.5, 8]: worst relative difference %.3e at x = %.6f (%.2f units of "
           "2^-24); device and host exp2_poly differ at %d of %d points\n",
           worst, at, worst / ldexp(1, -24), differ, n);
    cr_assert(differ == 0, "exp2_poly on the device differs from the host's at %d points, first x = %.9g: %.9g against %.9g",
              differ, first_x, first_dev, first_host);
    cr_assert(worst < TEST_EXP2_MAX_VS_MUFU, "exp2_poly against ex2.approx: %.3e at x = %g, over %g", worst, at,
              TEST_EXP2_MAX_VS_MUFU);
    free(poly), free(mufu);
    CUDA_CHECK(cudaFree(d_poly));
    CUDA_CHECK(cudaFree(d_mufu));
}
