/* copy_bw.cu: the device's copy bandwidth, the yardstick of a memory-bound kernel.
 *
 * cudaMemcpy of one device buffer into another (1 GiB by default, far past any L2), timed between
 * CUDA events, median and minimum of the timed runs after warm-up. A copy reads every byte once and
 * writes it once, so the bandwidth is 2 * bytes / time, as CUDA's bandwidthTest counts a
 * device-to-device copy: the HBM traffic, read plus write. A kernel that only reads (stage 14 reads
 * K and V) is measured against this number in the same run (bench/bench_decode.sh).
 * A small copy, timed alone, shows the fixed cost of one timed run as a kernel pays it (the launch
 * as the events see it, the first bytes' latency): --bytes B copies B bytes instead, and
 * --flush-l2 empties the L2 before each timed copy (common/cuda/l2_flush.cuh), as a stage's
 * --flush-l2 does, so that its source comes from HBM. bench_decode.sh times a copy of the K and V
 * bytes of each shape so (half of them read, half written: the same HBM traffic) beside the stage.
 * Prints a CSV header and one row (bytes,ms_median,ms_min,copy_gbps,device), nothing else on stdout.
 * Run: make bench/copy_bw && bench/copy_bw [--mib 1024 | --bytes B] [--flush-l2] [--warmup 3] [--iters 20]
 */
#include "common/cuda/cuda_check.h"
#include "common/cuda/l2_flush.cuh"

#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static void usage_error(const char *why)
{
    fprintf(stderr, "copy_bw: %s (usage: copy_bw [--mib M | --bytes B] [--flush-l2] [--warmup W] [--iters I])\n", why);
    exit(2);
}

/* a whole number from lo to hi, or exit 2 naming the option */
static long long parse_count(const char *name, const char *text, long long lo, long long hi)
{
    char *end;
    const long long v = strtoll(text, &end, 10);
    if (end == text || *end || v < lo || v > hi) {
        char why[160];
        snprintf(why, sizeof why, "%s %s: expected a whole number from %lld to %lld", name, text, lo, hi);
        usage_error(why);
    }
    return v;
}

int main(int argc, char **argv)
{
    size_t bytes = (size_t)1024 << 20;
    int warmup = 3, iters = 20, flush_l2 = 0;
    for (int k = 1; k < argc; k++) {
        const char *a = argv[k];
        if (!strcmp(a, "--flush-l2")) {
            flush_l2 = 1;
            continue;
        }
        if (strcmp(a, "--mib") && strcmp(a, "--bytes") && strcmp(a, "--warmup") && strcmp(a, "--iters")) {
            char why[160];
            snprintf(why, sizeof why, "unknown option %s", a);
            usage_error(why);
        }
        if (k + 1 >= argc) {
            char why[160];
            snprintf(why, sizeof why, "%s needs a value", a);
            usage_error(why);
        }
        const char *v = argv[++k];
        if (!strcmp(a, "--mib")) bytes = (size_t)parse_count(a, v, 1, 1 << 20) << 20;
        else if (!strcmp(a, "--bytes")) bytes = (size_t)parse_count(a, v, 16, 1LL << 40) / 16 * 16;
        else if (!strcmp(a, "--warmup")) warmup = (int)parse_count(a, v, 0, 1 << 20);
        else iters = (int)parse_count(a, v, 1, 1 << 20);
    }
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
    /* --flush-l2: a zeroed buffer twice the L2's size, read before each timed copy */
    void *flush = NULL;
    unsigned *sink = NULL;
    const size_t flush_bytes = 2 * (size_t)p.l2CacheSize;
    if (flush_l2) {
        CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
        CUDA_CHECK(cudaMemset(flush, 0, flush_bytes));
        CUDA_CHECK(cudaMalloc(&sink, sizeof *sink));
    }
    for (int w = 0; w < warmup; w++) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    std::vector<cudaEvent_t> start(iters), stop(iters);
    for (int it = 0; it < iters; it++) {
        CUDA_CHECK(cudaEventCreate(&start[it]));
        CUDA_CHECK(cudaEventCreate(&stop[it]));
    }
    for (int it = 0; it < iters; it++) {
        if (flush_l2) l2_flush(flush, flush_bytes, sink);
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
    fprintf(stderr, "copy_bw: %s: cudaMemcpy of %.1f MiB device to device in %.4f ms (median of %d%s): %.1f GB/s "
                    "read + written\n", p.name, bytes / 1048576.0, median, iters, flush_l2 ? ", L2 flushed before each" : "",
            2.0 * bytes / (median * 1e-3) / 1e9);
    CUDA_CHECK(cudaFree(src));
    CUDA_CHECK(cudaFree(dst));
    if (flush_l2) {
        CUDA_CHECK(cudaFree(flush));
        CUDA_CHECK(cudaFree(sink));
    }
    return 0;
}
