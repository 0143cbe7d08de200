/* cuda_check.h: every CUDA call checked. CUDA_CHECK(call) prints file, line, the call and the
 * error and exits with code 4; LAUNCH_CHECK() does the same for the last kernel launch. Inside a stage's
 * launcher, where an error must come back as a message instead of an exit, use CUDA_TRY. */
#ifndef CUDA_CHECK_H
#define CUDA_CHECK_H
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CUDA_CHECK(call)                                                                      \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            fprintf(stderr, "%s:%d: CUDA error in %s: %s\n", __FILE__, __LINE__, #call,       \
                    cudaGetErrorString(err_));                                                \
            exit(4);                                                                          \
        }                                                                                     \
    } while (0)

#define LAUNCH_CHECK() CUDA_CHECK(cudaGetLastError())

/* In a stage function (char *why, size_t n; returns int): on error, say where and return
 * ATTN_CUDA_ERROR (4, common/attn.h), which the harness turns into exit code 4. */
#define CUDA_TRY(call)                                                                        \
    do {                                                                                      \
        cudaError_t err_ = (call);                                                            \
        if (err_ != cudaSuccess) {                                                            \
            snprintf(why, n, "%s:%d: CUDA error in %s: %s", __FILE__, __LINE__, #call,        \
                     cudaGetErrorString(err_));                                               \
            return 4;                                                                         \
        }                                                                                     \
    } while (0)

#endif
