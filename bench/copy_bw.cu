/* copy_bw.cu: the device's copy bandwidth, the yardstick of a memory-bound kernel.
 *
 * cudaMemcpy of one device buffer into another (1 GiB by default, far past any L2), timed between
 * CUDA events, median and minimum of the timed runs after warm-up. A copy reads every byte once and
 * writes it once, so the bandwidth is 2 * bytes / time, as CUDA's bandwidthTest counts a
 * device-to-device copy: the HBM traffic, read plus write. A kernel that only reads (stage 14 reads
 * K and V) is measured against this number in the same run (bench/bench_decode.sh).
 * Prints a CSV header and one row (bytes,ms_median,ms_min,copy_gbps,device), nothing else on stdout.
 * Run: make bench/copy_bw && bench/copy_bw [--mib 1024] [--warmup 3] [--iters 20]
 */
#include "common/cuda/cuda_check.h"

#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static int arg_int(int argc, char **argv, const char *name, int def)
{
    for (int k = 1; k + 1 < argc; k++)
        if (!strcmp(argv[k], name)) {
            char *end;
            long v = strtol(argv[k + 1], &end, 10);
            if (*end || v < 1 || v > 1 << 20) {
                fprintf(stderr, "copy_bw: %s %s: expected a whole number from 1 to 1048576\n", name, argv[k + 1]);
                exit(2);
            }
            return (int)v;
        }
    return def;
}

int main(int argc, char **argv)
{
    for (int k = 1; k < argc; k += 2)
        if (strcmp(argv[k], "--mib") && strcmp(argv[k], "--warmup") && strcmp(argv[k], "--iters")) {
            fprintf(stderr, "usage: copy_bw [--mib M] [--warmup W] [--iters I]\n");
            return 2;
        }
    const size_t bytes = (size_t)arg_int(argc, argv, "--mib", 1024) << 20;
    const int warmup = arg_int(argc, argv, "--warmup", 3), iters = arg_int(argc, argv, "--iters", 20);
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "copy_bw: no CUDA device found\n");
        return 3;
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    void *src, *dst;
    CUDA_CHECK(cudaMalloc(&src, bytes));
    CUDA_CHECK(cudaMalloc(&dst, bytes));
    CUDA_CHECK(cudaMemset(src, 1, bytes)); /* touched once, so no first-use cost lands in a timed run */
    CUDA_CHECK(cudaMemset(dst, 0, bytes));
    for (int w = 0; w < warmup; w++) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    std::vector<cudaEvent_t> start(iters), stop(iters);
    for (int it = 0; it < iters; it++) {
        CUDA_CHECK(cudaEventCreate(&start[it]));
        CUDA_CHECK(cudaEventCreate(&stop[it]));
    }
    for (int it = 0; it < iters; it++) {
        CUDA_CHECK(cudaEventRecord(start[it]));
        CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
        CUDA_CHECK(cudaEventRecord(stop[it]));
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<double> t(iters);
    for (int it = 0; it < iters; it++) {
        float ms;
        CUDA_CHECK(cudaEventElapsedTime(&ms, start[it], stop[it]));
        t[it] = ms;
    }
    std::sort(t.begin(), t.end());
    const double median = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);
    /* the device's name, commas dropped (a CSV field) */
    for (char *c = p.name; *c; c++)
        if (*c == ',') *c = ' ';
    printf("bytes,ms_median,ms_min,copy_gbps,device\n");
    printf("%zu,%.4f,%.4f,%.1f,%s\n", bytes, median, t[0], 2.0 * bytes / (median * 1e-3) / 1e9, p.name);
    fprintf(stderr, "copy_bw: %s: cudaMemcpy of %.0f MiB device to device in %.3f ms (median of %d): %.1f GB/s "
                    "read + written\n", p.name, bytes / 1048576.0, median, iters, 2.0 * bytes / (median * 1e-3) / 1e9);
    CUDA_CHECK(cudaFree(src));
    CUDA_CHECK(cudaFree(dst));
    return 0;
}
