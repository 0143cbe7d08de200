/* copy_bw.cu: the device's copy bandwidth, and the floors of a memory-bound kernel.
 *
 * cudaMemcpy of one device buffer into another (1 GiB by default, far past any L2), timed between
 * CUDA events, median and minimum of the timed runs after warm-up. A copy reads every byte once and
 * writes it once, so the bandwidth is 2 * bytes / time, as CUDA's bandwidthTest counts a
 * device-to-device copy: the HBM traffic, read plus write. bench/bench_decode.sh prints a kernel
 * that only reads (stage 15 reads K and V) as a share of this number measured in the same run.
 * A small copy, timed alone, shows the fixed cost of one timed run as a kernel pays it (the launch
 * as the events see it, the first bytes' latency): --bytes B copies B bytes instead, and
 * --flush-l2 empties the L2 before each timed copy (common/cuda/l2_flush.cuh), as a stage's
 * --flush-l2 does, so that its source comes from HBM. bench_decode.sh times a copy of the K and V
 * bytes of each shape so (half of them read, half written: the same HBM traffic) beside the stage.
 * --read times a kernel that only reads the bytes instead (read_kernel: every SM full of threads,
 * each with four 16-byte loads in flight, nothing written): the least time any kernel that reads
 * them takes, timed the same way; a decode kernel's floor at its shape is `--read --bytes` its K
 * and V bytes `--flush-l2` (bench_decode.sh's hbm-read rows, which stage 15's claim is stated
 * against). Its bandwidth is bytes / time.
 * --read-ring reads them the way stage 15 streams K and V, computing nothing (read_ring_kernel: a
 * block per contiguous run of the bytes, through a cp.async ring of three 32 KiB tiles in shared
 * memory, a barrier per tile, every block resident at once): what the stage's loop costs without
 * its arithmetic and without its merge.
 * --read-bulk reads them through the same blocks and ring, each tile brought by the copy engine in
 * --pieces P bulk copies that one thread asks for (read_bulk_kernel; compute capability 9.0): whether
 * a stream that issues a few large copies per tile instead of 2048 small ones reads faster.
 * --empty times a kernel that does nothing (one warp): what a launch costs as the events see it,
 * the part of every timed run that no kernel can remove (--bytes is then ignored and reported 0).
 * Prints a CSV header and one row (bytes,ms_median,ms_min,copy_gbps,device; with --read,
 * --read-ring, --read-bulk and --empty the fourth column is read_gbps), nothing else on stdout.
 * Run: make bench/copy_bw && bench/copy_bw [--mib 1024 | --bytes B] [--read | --read-ring | --read-bulk [--pieces 1]
 *      | --empty] [--flush-l2] [--warmup 3] [--iters 20]
 */
#include "common/cuda/cuda_check.h"
#include "common/cuda/l2_flush.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/tma.cuh"

#include <algorithm>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

static void usage_error(const char *why)
{
    fprintf(stderr, "copy_bw: %s (usage: copy_bw [--mib M | --bytes B] [--read | --read-ring | --read-bulk [--pieces P] | "
            "--empty] [--flush-l2] [--warmup W] [--iters I])\n",
            why);
    exit(2);
}

/* --read: every 16 bytes of buf read once, four loads in flight per thread before any is used; the
 * XOR of what was read reaches `sink` only if it is a value it never is (buf holds the byte 1
 * everywhere, so every 16 bytes XOR to 0), which keeps the compiler from dropping the loads. */
constexpr int READ_THREADS = 256, READ_UNROLL = 4;
static __global__ void __launch_bounds__(READ_THREADS) read_kernel(const uint4 *buf, size_t n, unsigned *sink)
{
    const size_t stride = (size_t)gridDim.x * READ_THREADS;
    size_t k = (size_t)blockIdx.x * READ_THREADS + threadIdx.x;
    unsigned acc = 0;
    for (; k + (READ_UNROLL - 1) * stride < n; k += READ_UNROLL * stride) {
        uint4 v[READ_UNROLL];
#pragma unroll
        for (int u = 0; u < READ_UNROLL; u++) v[u] = __ldcs(buf + k + u * stride);
#pragma unroll
        for (int u = 0; u < READ_UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; k < n; k += stride) {
        const uint4 v = __ldcs(buf + k);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

/* The block's contiguous run [lo, hi) of the n 16-byte words (the runs within one of each other in
 * length; a block past the end gets an empty one), and how many tiles of RING_WORDS it takes. */
constexpr int RING_THREADS = 128, RING_TILE = 32768, RING_WORDS = RING_TILE / 16;
struct block_run {
    size_t lo, hi;
    int tiles;
};
static __device__ __forceinline__ block_run run_of_block(size_t n)
{
    const size_t per = (n + gridDim.x - 1) / gridDim.x, first = blockIdx.x * per;
    const size_t lo = first < n ? first : n, hi = n - lo < per ? n : lo + per;
    return {lo, hi, (int)((hi - lo + RING_WORDS - 1) / RING_WORDS)};
}

/* --read-ring: the block's run of the n 16-byte words, RING_TILE bytes at a time, into a ring of
 * STAGES tiles (common/cuda/mma.cuh's cp.async; a plain copy on Turing), as stage 15's loop: wait
 * for tile t, a barrier (every thread is done with tile t - 1), ask for tile t + STAGES - 1 into
 * tile t - 1's buffer, then read one word of tile t (the stage computes on it there). */
template <int STAGES>
static __global__ void __launch_bounds__(RING_THREADS) read_ring_kernel(const uint4 *buf, size_t n, unsigned *sink)
{
    extern __shared__ uint4 ring[]; /* [STAGES][RING_WORDS] */
    const block_run run = run_of_block(n);
    auto ask = [&](int t) { /* tile t's copies, one group (empty past the last tile) */
        const size_t w0 = run.lo + (size_t)t * RING_WORDS;
        if (t < run.tiles)
            for (size_t i = threadIdx.x; i < RING_WORDS && w0 + i < run.hi; i += RING_THREADS)
                cp_async_16(ring + (t % STAGES) * RING_WORDS + i, buf + w0 + i);
        cp_async_commit();
    };
    for (int t = 0; t < STAGES - 1; t++) ask(t);
    unsigned acc = 0;
    for (int t = 0; t < run.tiles; t++) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();
        ask(t + STAGES - 1);
        const uint4 v = ring[(t % STAGES) * RING_WORDS + threadIdx.x]; /* (a word the tile may not fill: never 0x9e..) */
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
}

/* --read-bulk: the blocks, the runs and the ring of --read-ring, but each tile comes by the copy
 * engine: one thread asks for it in `pieces` bulk copies (common/cuda/tma.cuh's bulk_load_1d), whose
 * bytes land counted on the tile's mbarrier, where --read-ring has every thread issue 16 cp.async
 * of 16 bytes. Whether the stream itself is faster when an SM asks for its bytes in a few large
 * copies. Compute capability 9.0 (the host refuses below it; the body compiles to nothing there). */
template <int STAGES>
static __global__ void __launch_bounds__(RING_THREADS) read_bulk_kernel(const uint4 *buf, size_t n, unsigned *sink,
                                                                        int pieces)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ uint4 ring[]; /* [STAGES][RING_WORDS] */
    __shared__ uint64_t full[STAGES]; /* full[s]: the tile in ring stage s has landed */
    const block_run run = run_of_block(n);
    if (threadIdx.x == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1);
        mbar_fence_init();
    }
    __syncthreads(); /* the barriers initialized before any thread waits on one */
    auto ask = [&](int t) { /* thread 0: tile t's bytes in `pieces` copies, announced to its barrier */
        if (t >= run.tiles) return;
        const size_t w0 = run.lo + (size_t)t * RING_WORDS;
        const unsigned words = (unsigned)(run.hi - w0 < RING_WORDS ? run.hi - w0 : RING_WORDS);
        const unsigned step = (words + pieces - 1) / pieces;
        mbar_arrive_expect_tx(&full[t % STAGES], words * 16);
        for (unsigned w = 0; w < words; w += step)
            bulk_load_1d(ring + (t % STAGES) * RING_WORDS + w, buf + w0 + w, (words - w < step ? words - w : step) * 16,
                         &full[t % STAGES]);
    };
    if (threadIdx.x == 0)
        for (int t = 0; t < STAGES - 1; t++) ask(t);
    unsigned acc = 0;
    for (int t = 0; t < run.tiles; t++) {
        mbar_wait(&full[t % STAGES], (t / STAGES) & 1); /* the (t / STAGES)-th use of its stage */
        __syncthreads(); /* every thread done with tile t - 1, whose stage the next copies fill */
        if (threadIdx.x == 0) ask(t + STAGES - 1);
        const uint4 v = ring[(t % STAGES) * RING_WORDS + threadIdx.x]; /* (a word the tile may not fill: never 0x9e..) */
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9e3779b9u) *sink = acc;
#else
    (void)buf, (void)n, (void)sink, (void)pieces;
#endif
}

/* --empty: nothing */
static __global__ void empty_kernel() {}

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
    int pieces = 1;
    enum { COPY, READ, READ_RING, READ_BULK, EMPTY } mode = COPY;
    for (int k = 1; k < argc; k++) {
        const char *a = argv[k];
        if (!strcmp(a, "--flush-l2")) {
            flush_l2 = 1;
            continue;
        }
        if (!strcmp(a, "--read") || !strcmp(a, "--read-ring") || !strcmp(a, "--read-bulk") || !strcmp(a, "--empty")) {
            if (mode != COPY) usage_error("--read, --read-ring, --read-bulk and --empty: one of them at most");
            mode = !strcmp(a, "--read")        ? READ
                   : !strcmp(a, "--read-ring") ? READ_RING
                   : !strcmp(a, "--read-bulk") ? READ_BULK
                                               : EMPTY;
            continue;
        }
        if (strcmp(a, "--mib") && strcmp(a, "--bytes") && strcmp(a, "--warmup") && strcmp(a, "--iters") &&
            strcmp(a, "--pieces")) {
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
        else if (!strcmp(a, "--pieces")) pieces = (int)parse_count(a, v, 1, RING_WORDS);
        else iters = (int)parse_count(a, v, 1, 1 << 20);
    }
    if (pieces != 1 && mode != READ_BULK) usage_error("--pieces goes with --read-bulk");
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "copy_bw: no CUDA device found\n");
        return 3;
    }
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, 0));
    if (mode == READ_BULK && p.major < 9) {
        fprintf(stderr, "copy_bw: --read-bulk needs compute capability 9.0 or later (cp.async.bulk); %s is %d.%d\n",
                p.name, p.major, p.minor);
        return 2;
    }
    if (mode == EMPTY) bytes = 0;
    void *src = NULL, *dst = NULL;
    if (bytes) {
        CUDA_CHECK(cudaMalloc(&src, bytes));
        CUDA_CHECK(cudaMemset(src, 1, bytes)); /* touched once, so no first-use cost lands in a timed run */
    }
    if (mode == COPY) {
        CUDA_CHECK(cudaMalloc(&dst, bytes));
        CUDA_CHECK(cudaMemset(dst, 0, bytes));
    }
    /* --flush-l2: a zeroed buffer twice the L2's size, read before each timed copy */
    void *flush = NULL;
    unsigned *sink = NULL;
    const size_t flush_bytes = 2 * (size_t)p.l2CacheSize;
    if (flush_l2) {
        CUDA_CHECK(cudaMalloc(&flush, flush_bytes));
        CUDA_CHECK(cudaMemset(flush, 0, flush_bytes));
    }
    CUDA_CHECK(cudaMalloc(&sink, sizeof *sink));
    /* --read, --read-ring, --read-bulk: as many blocks as the SMs hold at once, so that one wave reads everything.
     * The ring takes three tiles where a block may have 96 KiB of shared memory, else two (a T4),
     * and all of the SM's L1 as shared memory, as stage 15 does (two blocks an SM on an H200). */
    const uint4 *words = (const uint4 *)src;
    const size_t n = bytes / 16;
    int per_sm = 0, threads = 0;
    const int ring_stages = (size_t)p.sharedMemPerBlockOptin >= 3 * (size_t)RING_TILE ? 3 : 2;
    const int ring_bytes = ring_stages * RING_TILE;
    void (*ring_kernel)(const uint4 *, size_t, unsigned *) =
        ring_stages == 3 ? read_ring_kernel<3> : read_ring_kernel<2>;
    void (*bulk_kernel)(const uint4 *, size_t, unsigned *, int) =
        ring_stages == 3 ? read_bulk_kernel<3> : read_bulk_kernel<2>;
    if (mode == READ) {
        threads = READ_THREADS;
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_kernel, threads, 0));
    } else if (mode == READ_RING || mode == READ_BULK) {
        const void *kernel = mode == READ_RING ? (const void *)ring_kernel : (const void *)bulk_kernel;
        threads = RING_THREADS;
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, ring_bytes));
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
        CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, ring_bytes));
    }
    const int blocks = p.multiProcessorCount * std::max(per_sm, 1);
    auto timed = [&]() {
        if (mode == READ) read_kernel<<<blocks, threads>>>(words, n, sink);
        else if (mode == READ_RING) ring_kernel<<<blocks, threads, ring_bytes>>>(words, n, sink);
        else if (mode == READ_BULK) bulk_kernel<<<blocks, threads, ring_bytes>>>(words, n, sink, pieces);
        else if (mode == EMPTY) empty_kernel<<<1, 32>>>();
        else CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice));
    };
    for (int w = 0; w < warmup; w++) timed();
    std::vector<cudaEvent_t> start(iters), stop(iters);
    for (int it = 0; it < iters; it++) {
        CUDA_CHECK(cudaEventCreate(&start[it]));
        CUDA_CHECK(cudaEventCreate(&stop[it]));
    }
    for (int it = 0; it < iters; it++) {
        if (flush_l2) l2_flush(flush, flush_bytes, sink);
        CUDA_CHECK(cudaEventRecord(start[it]));
        timed();
        CUDA_CHECK(cudaEventRecord(stop[it]));
    }
    CUDA_CHECK(cudaGetLastError());
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
    const double gbps = (mode == COPY ? 2.0 : 1.0) * bytes / (median * 1e-3) / 1e9;
    printf("bytes,ms_median,ms_min,%s,device\n", mode == COPY ? "copy_gbps" : "read_gbps");
    printf("%zu,%.4f,%.4f,%.1f,%s\n", bytes, median, t[0], gbps, p.name);
    const char *flushed = flush_l2 ? ", L2 flushed before each" : "";
    if (mode == COPY)
        fprintf(stderr, "copy_bw: %s: cudaMemcpy of %.1f MiB device to device in %.4f ms (median of %d%s): %.1f GB/s "
                        "read + written\n", p.name, bytes / 1048576.0, median, iters, flushed, gbps);
    else if (mode == EMPTY)
        fprintf(stderr, "copy_bw: %s: a kernel that does nothing in %.4f ms (median of %d%s)\n", p.name, median, iters,
                flushed);
    else {
        char ring[64] = ""; /* how --read-ring and --read-bulk bring their tiles */
        if (mode != READ)
            snprintf(ring, sizeof ring, ", a %s ring of %d x 32 KiB", mode == READ_RING ? "cp.async" : "bulk-copy",
                     ring_stages);
        fprintf(stderr, "copy_bw: %s: a kernel that reads %.1f MiB (%d blocks of %d threads%s) in %.4f ms (median of "
                        "%d%s): %.1f GB/s read\n", p.name, bytes / 1048576.0, blocks, threads, ring, median, iters,
                flushed, gbps);
    }
    if (mode == READ_BULK) fprintf(stderr, "copy_bw: each tile in %d bulk cop%s\n", pieces, pieces == 1 ? "y" : "ies");
    if (src) CUDA_CHECK(cudaFree(src));
    if (dst) CUDA_CHECK(cudaFree(dst));
    if (flush) CUDA_CHECK(cudaFree(flush));
    CUDA_CHECK(cudaFree(sink));
    return 0;
}
