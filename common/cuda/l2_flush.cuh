/* l2_flush.cuh: empty the L2 cache of what a timed run will read, for the timings of memory-bound
 * work (--flush-l2 of the stages, common/cuda/runner.cu; bench/copy_bw --flush-l2).
 *
 * l2_flush reads a buffer twice the L2's size, so that when the timed run starts the L2 holds
 * nothing of its inputs (they come from HBM) and only clean lines, which it evicts for free.
 * Overwriting the buffer instead (a memset) would leave the L2 full of dirty lines that the timed
 * run pays to write back as it reads: for a memory-bound kernel (stage 15) tens of MB of HBM
 * writes inside its time. The XOR of what is read goes to `sink` only if it is a value it never is
 * (the buffer holds zeros: the caller zeroes it once), which keeps the compiler from dropping the
 * loads. */
#pragma once

#include <cuda_runtime.h>
#include <stddef.h>

static __global__ void l2_flush_kernel(const uint4 *buf, size_t n, unsigned *sink)
{
    unsigned acc = 0;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (size_t)gridDim.x * blockDim.x) {
        const uint4 v = buf[k];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

/* Queues the flush on the default stream: `buf`, `bytes` long (twice the L2's size, zeroed),
 * `sink` one unsigned of device memory. */
static inline void l2_flush(const void *buf, size_t bytes, unsigned *sink)
{
    l2_flush_kernel<<<1024, 256>>>((const uint4 *)buf, bytes / sizeof(uint4), sink);
}
