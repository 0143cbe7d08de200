/* test_fp8_quant.cu: the FP8 forward's quantization kernel (common/cuda/fp8_quant.cuh) on the GPU,
 * against the host (half.c's e4m3, fp8.c's Hadamard transform). Compiled for sm_90a with the
 * Hopper objects; skips unless the device is of compute capability 9.0.
 *
 * fp8_quant::{q,qh,v}_d{64,128}  two heads of N = 200 rows (a padded last block of 128), inputs
 *     uniform with 4 outlier channels x 50: the block scales are max|x| / 448 of the host's values
 *     (within 1e-5: the GPU's transform adds in another order), each element decodes to within
 *     half an e4m3 step of the host's value, padding rows are zero; qh with the Hadamard transform;
 *     v transposed, its columns permuted in 32-key groups (key_of_position), which the test
 *     inverts element by element.
 * fp8_quant::stage19_*  the stage's own instances: blocks of 64 rows (FP8_BLOCK_ROWS), d = 64 rows
 *     padded to 128 bytes (PITCH, the bytes past d zeros), V at d = 256. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <vector>
extern "C" {
#include "tests/common_test.h"
#include "common/fp8.h"
#include "common/half.h"
}
#include "common/cuda/cuda_check.h"
#include "common/cuda/fp8_quant.cuh"

#include <math.h>

#define TEST_Q8_ROWS 128
#define TEST_Q8_THREADS 256

template <int HeadDim, bool HADAMARD, bool TRANSPOSE, int ROWS = TEST_Q8_ROWS, int PITCH = HeadDim>
static void test_quantize(const char *label)
{
    test_require_gpu_arch(90, "fp8_quantize_kernel (sm_90a build)");
    const int heads = 2, N = 200, Npad = CEIL_DIV(N, ROWS) * ROWS, blocks = Npad / ROWS;
    const struct shape sh = test_shape(1, heads, N, HeadDim, 0);
    const size_t n = shape_elems(&sh);
    std::vector<float> X(n), Xk(n);
    fill_uniform(X.data(), n, 5, 1.0f, DT_F16), fill_uniform(Xk.data(), n, 6, 1.0f, DT_F16);
    add_outliers(&sh, 50.0f, DT_F16, X.data(), Xk.data());
    std::vector<uint16_t> Xh(n);
    for (size_t e = 0; e < n; e++) Xh[e] = f32_to_f16(X[e]);
    int8_t signs[256];
    hadamard_signs(signs, HeadDim, 3);
    hadamard_sign_bits bits = {};
    for (int c = 0; c < HeadDim; c++)
        if (signs[c] < 0) bits.bits[c >> 5] |= 1u << (c & 31);
    /* the host's values: transformed (qh), then per block of rows its amax */
    std::vector<float> ref(X);
    if (HADAMARD) hadamard_rows(ref.data(), (size_t)heads * N, HeadDim, signs);

    __half *dX;
    uint8_t *dX8;
    float *dS;
    const size_t n8 = (size_t)heads * Npad * (TRANSPOSE ? HeadDim : PITCH);
    CUDA_CHECK(cudaMalloc(&dX, n * 2));
    CUDA_CHECK(cudaMalloc(&dX8, n8));
    CUDA_CHECK(cudaMalloc(&dS, (size_t)heads * blocks * 4));
    CUDA_CHECK(cudaMemcpy(dX, Xh.data(), n * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dX8, 0x7f, n8)); /* NaN codes: a byte never written shows */
    fp8_quantize_kernel<HeadDim, ROWS, HADAMARD, TRANSPOSE, TEST_Q8_THREADS, PITCH>
        <<<dim3(blocks, heads), TEST_Q8_THREADS>>>(dX, dX8, dS, N, Npad, bits);
    LAUNCH_CHECK();
    std::vector<uint8_t> X8(n8);
    std::vector<float> S((size_t)heads * blocks);
    CUDA_CHECK(cudaMemcpy(X8.data(), dX8, n8, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(S.data(), dS, S.size() * 4, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dX));
    CUDA_CHECK(cudaFree(dX8));
    CUDA_CHECK(cudaFree(dS));

    for (int h = 0; h < heads; h++)
        for (int b = 0; b < blocks; b++) {
            float amax = 0;
            for (int r = b * ROWS; r < (b + 1) * ROWS && r < N; r++)
                for (int c = 0; c < HeadDim; c++) amax = fmaxf(amax, fabsf(ref[((size_t)h * N + r) * HeadDim + c]));
            const float want = amax > 0 ? amax / 448.0f : 1.0f, got = S[h * blocks + b];
            cr_assert(fabsf(got - want) <= 1e-5f * want, "%s: head %d block %d: scale %.9g, want %.9g", label, h, b, got,
                      want);
            for (int r = b * ROWS; r < (b + 1) * ROWS; r++) {
                for (int c = HeadDim; c < (TRANSPOSE ? HeadDim : PITCH); c++) /* a padded row's bytes past d */
                    cr_assert(X8[((size_t)h * Npad + r) * PITCH + c] == 0, "%s: head %d row %d byte %d past d: %#x, want 0",
                              label, h, r, c, X8[((size_t)h * Npad + r) * PITCH + c]);
                for (int c = 0; c < HeadDim; c++) {
                    /* where the kernel put element (r, c) */
                    const int p = (r & ~31) + [&] {
                        for (int q = 0; q < 32; q++)
                            if (key_of_position(q) == (r & 31)) return q;
                        return -1;
                    }();
                    const size_t at = TRANSPOSE ? ((size_t)h * HeadDim + c) * Npad + p : ((size_t)h * Npad + r) * PITCH + c;
                    const float x = r < N ? ref[((size_t)h * N + r) * HeadDim + c] : 0.0f;
                    const float y = e4m3_to_f32(X8[at]) * got;
                    /* half a step: 2^-4 relative for normals; 2^-10 of the scale in the subnormals */
                    const float tol = fabsf(x) / 16 + got / 1024 + 1e-5f * want * 448;
                    cr_assert(fabsf(y - x) <= tol, "%s: head %d row %d col %d: decodes to %.9g, want %.9g (tolerance %g)",
                              label, h, r, c, y, x, tol);
                }
            }
        }
}

Test(fp8_quant, q_d64) { test_quantize<64, false, false>("Q d=64"); }
Test(fp8_quant, q_d128) { test_quantize<128, false, false>("Q d=128"); }
Test(fp8_quant, qh_d64) { test_quantize<64, true, false>("Q d=64 Hadamard"); }
Test(fp8_quant, qh_d128) { test_quantize<128, true, false>("Q d=128 Hadamard"); }
Test(fp8_quant, qh_d256) { test_quantize<256, true, false>("Q d=256 Hadamard"); }
Test(fp8_quant, v_d64) { test_quantize<64, false, true>("V d=64 transposed"); }
Test(fp8_quant, v_d128) { test_quantize<128, false, true>("V d=128 transposed"); }
Test(fp8_quant, stage19_qh_d64) { test_quantize<64, true, false, 64, 128>("Q d=64 Hadamard, 64-row blocks, rows of 128 bytes"); }
Test(fp8_quant, stage19_k_d128) { test_quantize<128, false, false, 64>("K d=128, 64-row blocks"); }
Test(fp8_quant, stage19_v_d64) { test_quantize<64, false, true, 64>("V d=64 transposed, 64-row blocks"); }
Test(fp8_quant, stage19_v_d256) { test_quantize<256, false, true, 64>("V d=256 transposed, 64-row blocks"); }
