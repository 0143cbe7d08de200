/* launch.cuh: what every GPU stage's launcher does before its first launch.
 *
 * A kernel may use more than 48 KiB of dynamic shared memory per block only after it opts in, and
 * only up to the device's limit (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on most consumer
 * GPUs). smem_optin checks the limit, so a tile configuration too large for the student's GPU
 * fails with a message that says so rather than with a launch error, then opts the kernel in. */
#ifndef LAUNCH_CUH
#define LAUNCH_CUH
#include "common/cuda/cuda_check.h"
#include <stdio.h>

/* Returns 0, or 1 with the reason in why. stage and d only name the configuration in the message. */
template <typename Kernel>
static int smem_optin(Kernel *kernel, size_t bytes, const char *stage, int d, char *why, size_t n)
{
    int dev = 0, optin = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > (size_t)optin) {
        snprintf(why, n, "%s: d=%d needs %zu bytes of shared memory per block; this device allows %d", stage, d,
                 bytes, optin);
        return 1;
    }
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    return 0;
}

#endif
