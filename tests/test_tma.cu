/* test_tma.cu: the Hopper helpers of common/cuda/tma.cuh on the GPU (TMA, mbarrier, setmaxnreg,
 * named barriers).
 * Compiled for sm_90a alone (the Makefile's HOPPER_OBJS); every test skips with a one-line reason
 * unless the device is of compute capability 9.0.
 *
 * tma::load_{...}          one tile of a [heads][N][d] tensor by TMA (tma_map_heads, tma_load_3d,
 *                          one box per 64-column block, completing on an mbarrier) lands exactly
 *                          where load_tile_sw128 (cp.async, wgmma.cuh) puts it in the 128-byte
 *                          swizzle, and where the picture in wgmma.cuh says; rows at or past N of
 *                          the head come back zero over a nonzero pre-fill, never the next head's
 *                          rows. Cases: a tail tile over two column blocks, a box taller than the
 *                          whole head (the last head: past the end of the tensor too), four
 *                          column blocks in bounds, N = 1, and bf16.
 * tma::mbarrier_phases     an mbarrier over six phases: before the arrivals of phase r, a wait for
 *                          its parity is not satisfied and one for the other parity is (phase r - 1;
 *                          for r = 0 the phase "before" the first); after them, the reverse.
 * tma::ring_{...}          stage 12's structure in miniature: a producer warpgroup (setmaxnreg.dec
 *                          24) whose one thread streams every 64-row tile of a head through a ring
 *                          of 3 stages with full and empty mbarriers; two consumer warpgroups
 *                          (setmaxnreg.inc 240) copy each tile out, un-swizzled. The output must be
 *                          the input exactly, and the padding past N zeros. N = 1000 (16 tiles,
 *                          six times round the ring), 192 (exactly one round), 257, 1.
 * tma::named_barrier_turns two groups of 128 threads take 50 turns each through two named barriers
 *                          (named_barrier_sync, named_barrier_arrive: stage 13's ping-pong), one
 *                          group idling between its turns; the log of turns must alternate, group
 *                          0 first, and the kernel end (both barriers on a whole phase).
 *
 * All of it but the turns is copies: every result must equal the input bit for bit.
 */
/* common_test.h declares C functions without extern "C": included inside a block of it, after
 * the C++ headers it pulls in (as in test_mma.cu). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
extern "C" {
#include "tests/common_test.h"
}
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"

#include <string.h>
#include <vector>

#define TEST_TMA_ARCH 90        /* compute capability the sm_90a code runs on */
#define TEST_TMA_HEADS 3        /* heads in the test tensors: a box must not reach the next head */
#define TEST_TMA_FILL 0xA5A5u   /* shared memory's pre-fill: a zero must come from the copy engine */
#define TEST_TMA_UNWRITTEN 0xFFFFu /* global outputs' pre-fill: an element never written shows */

static void test_require_hopper(void) { test_require_gpu_arch(TEST_TMA_ARCH, "TMA (sm_90a)"); }

/* Element i of the test tensors: never 0 (a zero must come from a fill), and 16 bits of i. */
static uint16_t test_tma_value(size_t i) { return (uint16_t)(1 + i % 65521u); }

/* ---- one tile by TMA against load_tile_sw128 ---- */

#define TEST_TMA_THREADS 128

/* The tile of ROWS rows from row0 of head `head`, once by TMA and once by load_tile_sw128 (from
 * the head's base, with its N), both copied out of shared memory raw. */
template <typename T, int ELEMS, int ROWS>
static __global__ void __launch_bounds__(TEST_TMA_THREADS)
test_tma_load_kernel(const __grid_constant__ CUtensorMap map, const T *src, int N, int row0, int head,
                     uint16_t *raw_tma, uint16_t *raw_cp)
{
    constexpr int TILE = ROWS * ELEMS;
    extern __shared__ __align__(SW128_ATOM_BYTES) unsigned char smem[];
    uint16_t *tile_tma = (uint16_t *)smem, *tile_cp = tile_tma + TILE;
    uint64_t *bar = (uint64_t *)(tile_cp + TILE);
    static_assert(2 * TILE % SW128_ATOM_BYTES == 0, "the second tile on a 1024-byte atom");
    const int tid = threadIdx.x;

    for (int i = tid; i < 2 * TILE; i += blockDim.x) tile_tma[i] = TEST_TMA_FILL;
    fence_proxy_async_smem(); /* the pre-fill, ordinary stores, ordered before the copy engine's
                               * writes over the same bytes */
    if (tid == 0) {
        mbar_init(bar, 1);
        mbar_fence_init();
    }
    __syncthreads(); /* the pre-fill and the barrier in place before the copy is issued */
    if (tid == 0) {
        mbar_arrive_expect_tx(bar, 2 * TILE); /* the whole box counts, out-of-bounds rows too */
        for (int cb = 0; cb < ELEMS / TMA_BOX_ELEMS; cb++)
            tma_load_3d(tile_tma + cb * ROWS * TMA_BOX_ELEMS, &map, bar, cb * TMA_BOX_ELEMS, row0, head);
    }
    load_tile_sw128<T, ELEMS, ROWS, TEST_TMA_THREADS>(tile_cp, src + (size_t)head * N * ELEMS, row0, N);
    cp_async_commit();
    cp_async_wait<0>();
    mbar_wait(bar, 0); /* the TMA bytes have landed (phase 0) */
    __syncthreads();   /* and every thread's cp.async too */
    for (int i = tid; i < TILE; i += blockDim.x) raw_tma[i] = tile_tma[i], raw_cp[i] = tile_cp[i];
}

template <typename T, int ELEMS, int ROWS>
static void test_tma_load_run(const char *label, int N, int row0, int head)
{
    constexpr int TILE = ROWS * ELEMS;
    const size_t elems = (size_t)TEST_TMA_HEADS * N * ELEMS;
    std::vector<uint16_t> src(elems), raw_tma(TILE), raw_cp(TILE), want(TILE);
    for (size_t i = 0; i < elems; i++) src[i] = test_tma_value(i);
    /* the picture in wgmma.cuh: element (r, col) -> column block col / 64 (ROWS rows of 128 bytes
     * each), row r, 16-byte chunk ((col % 64) / 8) ^ (r % 8), element col % 8 */
    for (int r = 0; r < ROWS; r++)
        for (int col = 0; col < ELEMS; col++) {
            const int at = (col / 64) * ROWS * 64 + r * 64 + ((((col % 64) / 8) ^ (r % 8)) * 8) + col % 8;
            want[at] = row0 + r < N ? src[((size_t)head * N + row0 + r) * ELEMS + col] : 0;
        }

    T *dsrc;
    uint16_t *dtma, *dcp;
    CUDA_CHECK(cudaMalloc(&dsrc, elems * 2));
    CUDA_CHECK(cudaMalloc(&dtma, TILE * 2));
    CUDA_CHECK(cudaMalloc(&dcp, TILE * 2));
    CUDA_CHECK(cudaMemcpy(dsrc, src.data(), elems * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dtma, 0x5a, TILE * 2));
    CUDA_CHECK(cudaMemset(dcp, 0x5a, TILE * 2));
    CUtensorMap map;
    char why[256];
    cr_assert(tma_map_heads<T>(&map, dsrc, TEST_TMA_HEADS, N, ELEMS, ROWS, why, sizeof why) == 0, "%s: %s", label,
              why);
    const size_t smem = 2 * (size_t)TILE * 2 + sizeof(uint64_t);
    auto kernel = test_tma_load_kernel<T, ELEMS, ROWS>;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<1, TEST_TMA_THREADS, smem>>>(map, dsrc, N, row0, head, dtma, dcp);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(raw_tma.data(), dtma, TILE * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(raw_cp.data(), dcp, TILE * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dsrc));
    CUDA_CHECK(cudaFree(dtma));
    CUDA_CHECK(cudaFree(dcp));

    int first = -1, differ = 0, differ_cp = 0;
    for (int i = 0; i < TILE; i++) {
        if (raw_tma[i] != want[i] && first < 0) first = i;
        differ += raw_tma[i] != want[i];
        differ_cp += raw_tma[i] != raw_cp[i];
    }
    const int i = first < 0 ? 0 : first;
    cr_assert(differ == 0, "%s: shared element %d (block %d, row %d, chunk %d, element %d) holds 0x%04x, want 0x%04x; "
              "%d of %d differ", label, i, i / (ROWS * 64), i % (ROWS * 64) / 64, i % 64 / 8, i % 8, raw_tma[i], want[i],
              differ, TILE);
    cr_assert(differ_cp == 0, "%s: the TMA tile and load_tile_sw128's differ in %d of %d elements", label, differ_cp,
              TILE);
}

/* name, dtype, columns (d), box rows, N, first row, head */
#define TEST_TMA_LOAD(name, T, ELEMS, ROWS, N, row0, head)                                              \
    Test(tma, name)                                                                                     \
    {                                                                                                   \
        test_require_hopper();                                                                          \
        test_tma_load_run<T, ELEMS, ROWS>("tma " #name " (d=" #ELEMS ", " #ROWS " rows from row " #row0  \
                                          " of N=" #N ", head " #head ")", N, row0, head);              \
    }

TEST_TMA_LOAD(load_tail_two_blocks, __half, 128, 64, 100, 64, 1)
TEST_TMA_LOAD(load_box_past_last_head, __half, 64, 128, 100, 0, 2)
TEST_TMA_LOAD(load_four_blocks, __half, 256, 64, 100, 0, 0)
TEST_TMA_LOAD(load_one_row, __half, 128, 128, 1, 0, 1)
TEST_TMA_LOAD(load_bf16_tail, __nv_bfloat16, 128, 64, 77, 64, 1)

/* ---- mbarrier phases ---- */

#define TEST_MB_THREADS 64 /* two warps: the barrier's arrival count */
#define TEST_MB_ROUNDS 6
#define TEST_MB_PROBES 4   /* per round: before the arrivals (parity r, r - 1), after (r, r + 1) */

/* seen[TEST_MB_PROBES * r + k]: what thread 0's k-th try_wait of round r answered (0 or 1). */
static __global__ void __launch_bounds__(TEST_MB_THREADS) test_mbar_phase_kernel(int *seen)
{
    __shared__ uint64_t bar;
    const int tid = threadIdx.x;
    if (tid == 0) {
        mbar_init(&bar, TEST_MB_THREADS);
        mbar_fence_init();
    }
    __syncthreads(); /* the barrier initialized before anyone arrives */
    for (int r = 0; r < TEST_MB_ROUNDS; r++) {
        const unsigned parity = r & 1;
        if (tid == 0) {
            seen[TEST_MB_PROBES * r + 0] = mbar_try_wait(&bar, parity);     /* phase r: open */
            seen[TEST_MB_PROBES * r + 1] = mbar_try_wait(&bar, parity ^ 1); /* phase r - 1: done */
        }
        __syncthreads(); /* thread 0 has looked before anyone arrives on phase r */
        mbar_arrive(&bar);
        mbar_wait(&bar, parity); /* the last arrival completes phase r, for every waiter */
        if (tid == 0) {
            seen[TEST_MB_PROBES * r + 2] = mbar_try_wait(&bar, parity);     /* phase r: done */
            seen[TEST_MB_PROBES * r + 3] = mbar_try_wait(&bar, parity ^ 1); /* phase r + 1: open */
        }
        __syncthreads(); /* thread 0 has looked before anyone arrives on phase r + 1 */
    }
}

Test(tma, mbarrier_phases)
{
    test_require_hopper();
    enum { N_SEEN = TEST_MB_PROBES * TEST_MB_ROUNDS };
    static const int want[TEST_MB_PROBES] = {0, 1, 1, 0};
    static const char *what[TEST_MB_PROBES] = {"before its arrivals, phase r", "before its arrivals, phase r - 1",
                                               "after its arrivals, phase r", "after its arrivals, phase r + 1"};
    int *dseen, seen[N_SEEN];
    CUDA_CHECK(cudaMalloc(&dseen, sizeof seen));
    CUDA_CHECK(cudaMemset(dseen, 0xff, sizeof seen));
    test_mbar_phase_kernel<<<1, TEST_MB_THREADS>>>(dseen);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(seen, dseen, sizeof seen, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dseen));
    for (int k = 0; k < N_SEEN; k++)
        cr_assert(seen[k] == want[k % TEST_MB_PROBES], "mbarrier round %d, %s: try_wait answered %d, want %d "
                  "(%s)", k / TEST_MB_PROBES, what[k % TEST_MB_PROBES], seen[k], want[k % TEST_MB_PROBES],
                  want[k % TEST_MB_PROBES] ? "completed" : "not completed");
}

/* ---- a producer/consumer ring ---- */

#define TEST_RING_ELEMS 128   /* d: two column blocks per tile */
#define TEST_RING_ROWS 64     /* rows per tile */
#define TEST_RING_STAGES 3
#define TEST_RING_CONSUMER_WARPS 8 /* two consumer warpgroups */
#define TEST_RING_THREADS (TEST_RING_CONSUMER_WARPS * WARP_SIZE + 128) /* the consumers, then the producer */
#define TEST_RING_TILE (TEST_RING_ROWS * TEST_RING_ELEMS)

/* One block per head: every tile of the head through the ring, each copied to out[head][tile row]
 * (Tc * 64 rows per head, the padding past N included) in row-major order. */
static __global__ void __launch_bounds__(TEST_RING_THREADS, 1)
test_ring_kernel(const __grid_constant__ CUtensorMap map, int N, uint16_t *out)
{
    extern __shared__ __align__(SW128_ATOM_BYTES) unsigned char smem[];
    uint16_t *ring = (uint16_t *)smem; /* [TEST_RING_STAGES][TEST_RING_TILE] */
    uint64_t *full = (uint64_t *)(ring + TEST_RING_STAGES * TEST_RING_TILE), *empty = full + TEST_RING_STAGES;
    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE, head = blockIdx.x;
    const int n_tiles = CEIL_DIV(N, TEST_RING_ROWS);
    if (tid == 0) {
        for (int s = 0; s < TEST_RING_STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], TEST_RING_CONSUMER_WARPS);
        mbar_fence_init();
    }
    __syncthreads(); /* the barriers in place; the last barrier of the whole block */

    if (warp >= TEST_RING_CONSUMER_WARPS) { /* the producer warpgroup */
        setmaxnreg_dec<24>();
        if (tid == TEST_RING_CONSUMER_WARPS * WARP_SIZE) {
            for (int j = 0; j < n_tiles; j++) {
                const int s = j % TEST_RING_STAGES, round = j / TEST_RING_STAGES;
                if (round > 0) mbar_wait(&empty[s], (round - 1) & 1); /* tile j - STAGES copied out */
                mbar_arrive_expect_tx(&full[s], 2 * TEST_RING_TILE);
                for (int cb = 0; cb < TEST_RING_ELEMS / TMA_BOX_ELEMS; cb++)
                    tma_load_3d(ring + s * TEST_RING_TILE + cb * TEST_RING_ROWS * TMA_BOX_ELEMS, &map, &full[s],
                                cb * TMA_BOX_ELEMS, j * TEST_RING_ROWS, head);
            }
        }
        return;
    }
    setmaxnreg_inc<240>(); /* 24 x 128 + 240 x 256 = 64512 = 168 x 384, what the block started with */
    constexpr int CHUNKS = TEST_RING_ELEMS / 8;
    for (int j = 0; j < n_tiles; j++) {
        const int s = j % TEST_RING_STAGES;
        mbar_wait(&full[s], (j / TEST_RING_STAGES) & 1); /* tile j has landed in stage s */
        const uint16_t *tile = ring + s * TEST_RING_TILE;
        for (int c = tid; c < TEST_RING_ROWS * CHUNKS; c += TEST_RING_CONSUMER_WARPS * WARP_SIZE) {
            const int r = c / CHUNKS, chunk = c % CHUNKS;
            *(uint4 *)&out[((size_t)head * n_tiles * TEST_RING_ROWS + j * TEST_RING_ROWS + r) * TEST_RING_ELEMS +
                           chunk * 8] = *(const uint4 *)&tile[sw128<TEST_RING_ROWS>(r, chunk)];
        }
        fence_proxy_async_smem(); /* this thread's ordinary reads of the stage, before the copy engine
                                   * writes it again */
        __syncwarp();             /* the whole warp is done with stage s ... */
        if (lane == 0) mbar_arrive(&empty[s]); /* ... and says so, once */
    }
}

static void test_ring_run(const char *label, int N)
{
    const int n_tiles = CEIL_DIV(N, TEST_RING_ROWS);
    const size_t elems = (size_t)TEST_TMA_HEADS * N * TEST_RING_ELEMS;
    const size_t out_elems = (size_t)TEST_TMA_HEADS * n_tiles * TEST_RING_ROWS * TEST_RING_ELEMS;
    std::vector<uint16_t> src(elems), out(out_elems);
    for (size_t i = 0; i < elems; i++) src[i] = test_tma_value(i);

    uint16_t *dsrc, *dout;
    CUDA_CHECK(cudaMalloc(&dsrc, elems * 2));
    CUDA_CHECK(cudaMalloc(&dout, out_elems * 2));
    CUDA_CHECK(cudaMemcpy(dsrc, src.data(), elems * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dout, 0xff, out_elems * 2));
    CUtensorMap map;
    char why[256];
    cr_assert(tma_map_heads<__half>(&map, (const __half *)dsrc, TEST_TMA_HEADS, N, TEST_RING_ELEMS, TEST_RING_ROWS,
                                    why, sizeof why) == 0, "%s: %s", label, why);
    const size_t smem = (size_t)TEST_RING_STAGES * TEST_RING_TILE * 2 + 2 * TEST_RING_STAGES * sizeof(uint64_t);
    CUDA_CHECK(cudaFuncSetAttribute(test_ring_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    test_ring_kernel<<<TEST_TMA_HEADS, TEST_RING_THREADS, smem>>>(map, N, dout);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(out.data(), dout, out_elems * 2, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dsrc));
    CUDA_CHECK(cudaFree(dout));

    size_t first = (size_t)-1, differ = 0;
    uint16_t want_first = 0;
    for (int h = 0; h < TEST_TMA_HEADS; h++)
        for (int r = 0; r < n_tiles * TEST_RING_ROWS; r++)
            for (int col = 0; col < TEST_RING_ELEMS; col++) {
                const size_t at = ((size_t)h * n_tiles * TEST_RING_ROWS + r) * TEST_RING_ELEMS + col;
                const uint16_t want = r < N ? src[((size_t)h * N + r) * TEST_RING_ELEMS + col] : 0;
                if (out[at] != want) {
                    if (!differ) first = at, want_first = want;
                    differ++;
                }
            }
    const size_t per_head = (size_t)n_tiles * TEST_RING_ROWS * TEST_RING_ELEMS;
    cr_assert(differ == 0, "%s: head %zu row %zu column %zu holds 0x%04x, want 0x%04x%s; %zu of %zu differ", label,
              first / per_head, first % per_head / TEST_RING_ELEMS, first % TEST_RING_ELEMS, out[first], want_first,
              out[first] == TEST_TMA_UNWRITTEN ? " (never written)" : "", differ, out_elems);
}

#define TEST_RING(name, N)                                                                        \
    Test(tma, name)                                                                               \
    {                                                                                             \
        test_require_hopper();                                                                    \
        test_ring_run("tma " #name " (N=" #N ", 64-row tiles through 3 stages)", N);              \
    }

TEST_RING(ring_many_rounds, 1000)
TEST_RING(ring_one_round, 192)
TEST_RING(ring_tail, 257)
TEST_RING(ring_one_row, 1)

/* ---- turns through two named barriers (stage 13's ping-pong) ---- */

#define TEST_TURNS 50          /* turns per group */
#define TEST_TURN_GROUP 128    /* threads per group: a warpgroup */
#define TEST_TURN_BAR 3        /* group g waits for its turn at barrier 3 + g */
#define TEST_TURN_IDLE 2000    /* clocks group 0 idles between its turns */

/* Two groups of 128 threads take turns: group g waits at barrier 3 + g (bar.sync, its 128) until
 * the other group arrives there (bar.arrive, 128 more); in its turn the group's first thread
 * appends g to a log, then the group hands the turn over. Group 1 hands the first turn to group 0
 * before anything else, and group 0 takes back the last one at the end, so that both barriers end
 * on a whole phase. Group 0 idles between its turns: without the turns, group 1 would log several
 * times in a row. */
static __global__ void __launch_bounds__(2 * TEST_TURN_GROUP, 1) test_turns_kernel(int *out)
{
    __shared__ int log_[2 * TEST_TURNS], count;
    const int tid = threadIdx.x, g = tid / TEST_TURN_GROUP;
    if (tid == 0) count = 0;
    __syncthreads(); /* count is 0 before any turn */
    if (g == 1) named_barrier_arrive(TEST_TURN_BAR + 0, 2 * TEST_TURN_GROUP); /* the first turn is group 0's */
    for (int k = 0; k < TEST_TURNS; k++) {
        named_barrier_sync(TEST_TURN_BAR + g, 2 * TEST_TURN_GROUP); /* this group's turn */
        if (tid % TEST_TURN_GROUP == 0) log_[count++] = g;
        named_barrier_arrive(TEST_TURN_BAR + 1 - g, 2 * TEST_TURN_GROUP); /* the other group's turn; the
                                                                          * log entry released to it */
        if (g == 0) {
            const long long t0 = clock64();
            while (clock64() - t0 < TEST_TURN_IDLE) {
            }
        }
    }
    if (g == 0) named_barrier_sync(TEST_TURN_BAR + 0, 2 * TEST_TURN_GROUP); /* the last hand-over, taken back */
    __syncthreads(); /* every entry written */
    for (int k = tid; k < 2 * TEST_TURNS; k += blockDim.x) out[k] = log_[k];
    if (tid == 0) out[2 * TEST_TURNS] = count;
}

Test(tma, named_barrier_turns)
{
    test_require_hopper();
    int *dout, got[2 * TEST_TURNS + 1];
    CUDA_CHECK(cudaMalloc(&dout, sizeof got));
    CUDA_CHECK(cudaMemset(dout, 0xff, sizeof got));
    test_turns_kernel<<<1, 2 * TEST_TURN_GROUP>>>(dout);
    LAUNCH_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(dout));
    cr_assert(got[2 * TEST_TURNS] == 2 * TEST_TURNS, "named barrier turns: %d turns logged, want %d",
              got[2 * TEST_TURNS], 2 * TEST_TURNS);
    for (int k = 0; k < 2 * TEST_TURNS; k++)
        cr_assert(got[k] == k % 2, "named barrier turns: turn %d was group %d's, want group %d's (the groups "
                  "alternate, group 0 first)", k, got[k], k % 2);
}
