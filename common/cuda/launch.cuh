/* launch.cuh: what every GPU stage's launcher does before its first launch.
 *
 * A kernel may use more than 48 KiB of dynamic shared memory per block only after it opts in, and
 * only up to the device's limit (227 KiB on sm_90, 163 KiB on sm_80, 99 KiB on most consumer
 * GPUs). smem_optin checks the limit, so a tile configuration too large for the student's GPU
 * fails with a message that says so rather than with a launch error, then opts the kernel in. */
#ifndef LAUNCH_CUH
#define LAUNCH_CUH
#include "common/attn.h"
#include "common/cuda/cuda_check.h"
#include <stdio.h>

/* Returns 0, or ATTN_UNSUPPORTED with the reason in why (d only names the configuration in the
 * message). The opt-in is a runtime call, so it is made once per kernel and size, not on every
 * launch: the launchers call this inside the timed loop. */
template <typename Kernel>
static int smem_optin(Kernel *kernel, size_t bytes, int d, char *why, size_t n)
{
    /* kernels already opted in, with the size they asked for (a stage has a handful) */
    static struct { const void *kernel; size_t bytes; } done[64];
    static int n_done = 0;
    for (int k = 0; k < n_done; k++)
        if (done[k].kernel == (const void *)kernel && done[k].bytes >= bytes) return 0;
    int dev = 0, optin = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
    if (bytes > (size_t)optin) {
        snprintf(why, n, "d=%d needs %zu bytes of shared memory per block; this device allows %d", d, bytes, optin);
        return ATTN_UNSUPPORTED;
    }
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    if (n_done < 64) done[n_done++] = {(const void *)kernel, bytes};
    return 0;
}

#endif
