/* tma.cuh: Hopper's tensor memory accelerator (TMA), the mbarriers that say when its bytes have
 * landed, and the two instructions a warp-specialized kernel adds (setmaxnreg, named barriers):
 * the plumbing of stage 12's producer and consumers, and of stage 13's turns. sm_90a only, like
 * wgmma.cuh: compile with -gencode arch=compute_90a,code=sm_90a; the code runs on compute
 * capability 9.0 alone. (The 1-D bulk copy and the mbarriers are plain sm_90: bench/copy_bw, built
 * for every architecture, uses them in a kernel whose body exists only for 9.0.)
 *
 * The copy engine. One thread issues cp.async.bulk.tensor with a *tensor map* (a 128-byte
 * description of a tensor in global memory: its base, sizes, strides, the box one copy moves and
 * the swizzle it writes shared memory in) and box coordinates; the TMA unit then copies the whole
 * box into shared memory on its own, zero-filling the elements that fall outside the tensor, and
 * counts the bytes it wrote against an mbarrier in shared memory. No thread holds an address or a
 * register for the data, and no thread waits at the copy: threads that need the data wait on the
 * mbarrier.
 *
 * The tensor map is built on the host by the driver's cuTensorMapEncodeTiled, reached through the
 * runtime (cudaGetDriverEntryPointByVersion), so nothing links against the driver library; the
 * kernel takes it as a `const __grid_constant__ CUtensorMap` parameter (the copy engine reads it
 * from the kernel's parameter space, which __grid_constant__ keeps in place rather than copied to
 * the stack).
 *
 * The mbarrier. A 64-bit object in shared memory that counts two things towards the end of its
 * current *phase*: arrivals (the count given at init; each mbar_arrive takes one off) and
 * transaction bytes (mbar_arrive_expect_tx adds the bytes a copy will bring; the copy engine takes
 * them off as they land). When both reach zero the phase completes, the barrier resets to its
 * arrival count, and the next phase begins. Phases are numbered 0, 1, 2, ...; a waiter names the
 * phase it waits for by its parity (phase & 1):
 *
 *   mbar_wait(bar, p)  returns once the phase of parity p has completed, i.e. as soon as the
 *                      barrier's current phase has parity !p. So a waiter must know which phase it
 *                      is at: a parity bit it flips each time round its ring (stage 12: the
 *                      (j / STAGES)-th use of a ring stage waits for parity (j / STAGES) & 1).
 *   On a fresh barrier (current phase 0) a wait for parity 1 returns at once: it reads as "the
 *   phase before 0 has completed". Stage 12 never relies on that; it just skips the first waits.
 *
 * Proxies. TMA copies and wgmma both reach shared memory through the *async proxy*; ordinary
 * loads and stores (and cp.async) through the *generic proxy*. Between the two, ordering is not
 * implied: shared memory written by ordinary stores must be fenced (fence_proxy_async_smem, in
 * wgmma.cuh) before the copy engine or the tensor cores read it, or before a TMA copy overwrites
 * it. Data a TMA copy wrote is visible to a thread once its wait on the copy's mbarrier returns:
 * no fence there.
 */
#ifndef TMA_CUH
#define TMA_CUH

#include "common/attn.h"
#include "common/cuda/wgmma.cuh"

#include <cuda.h>         /* CUtensorMap and its enums: types only, no driver library linked */
#include <cudaTypedefs.h> /* PFN_cuTensorMapEncodeTiled_v12000, the function's type */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <type_traits>

/* ---- the tensor map (host) ---- */

#define TMA_BOX_ELEMS 64 /* a box's row: 64 16-bit elements, 128 bytes, the 128-byte swizzle's row */

/* The driver's cuTensorMapEncodeTiled, looked up once through the runtime; NULL with the reason
 * in why when the driver has none (older than CUDA 12.0). */
static PFN_cuTensorMapEncodeTiled_v12000 tma_encode_tiled(char *why, size_t n)
{
    static PFN_cuTensorMapEncodeTiled_v12000 encode = NULL;
    if (encode) return encode;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                                             &found);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || !fn) {
        snprintf(why, n, "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a CUDA 12 driver): %s",
                 err != cudaSuccess ? cudaGetErrorString(err) : "symbol not found");
        return NULL;
    }
    encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    return encode;
}

/* A tensor map for a [heads][rows][cols] tensor in global memory, elements of `esize` bytes of
 * type `type`, with a box of box_rows rows of one head by one 128-byte swizzle row of columns
 * (128 / esize of them), written to shared memory in the 128-byte swizzle. Three dimensions rather
 * than a [heads * rows][cols] matrix, so that a box reaching past row `rows` of its head is out of
 * bounds (zero-filled) instead of reading the next head's rows: the tails of the last tiles come
 * back as zeros, and the transaction count is the full box all the same. Dimensions go innermost
 * first (cols, rows, heads); strides are in bytes, for dimensions 1 and 2 only. Returns 0, or
 * ATTN_CUDA_ERROR with the reason in why. */
static inline int tma_map_sw128(CUtensorMap *map, CUtensorMapDataType type, int esize, const void *base, long long heads,
                                int rows, int cols, int box_rows, char *why, size_t n)
{
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tma_encode_tiled(why, n);
    if (!encode) return ATTN_CUDA_ERROR;
    const int box_cols = 128 / esize;
    const cuuint64_t dims[3] = {(cuuint64_t)cols, (cuuint64_t)rows, (cuuint64_t)heads};
    const cuuint64_t strides[2] = {(cuuint64_t)cols * esize, (cuuint64_t)rows * cols * esize};
    const cuuint32_t box[3] = {(cuuint32_t)box_cols, (cuuint32_t)box_rows, 1};
    const cuuint32_t steps[3] = {1, 1, 1}; /* every element of the box, no striding */
    const CUresult r = encode(map, type, 3, (void *)base, dims, strides, box, steps, CU_TENSOR_MAP_INTERLEAVE_NONE,
                              CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                              CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE /* out of bounds reads as zero */);
    if (r != CUDA_SUCCESS) {
        snprintf(why, n, "cuTensorMapEncodeTiled failed (CUresult %d) for a [%lld][%d][%d] tensor of %d-byte elements "
                 "at %p, box %d x %d", (int)r, heads, rows, cols, esize, base, box_rows, box_cols);
        return ATTN_CUDA_ERROR;
    }
    return 0;
}

/* The stages' [B, H, N, d] tensors of 16-bit T (heads = B * H): a box of box_rows rows by 64
 * columns (TMA_BOX_ELEMS), which fills box_rows x 128 bytes exactly as load_tile_sw128 (wgmma.cuh)
 * lays out one 64-column block of a tile: a tile of d columns is d / 64 copies, each into its
 * column block. */
template <typename T>
static int tma_map_heads(CUtensorMap *map, const T *base, long long heads, int N, int d, int box_rows, char *why,
                         size_t n)
{
    static_assert(sizeof(T) == 2 && 128 / sizeof(T) == TMA_BOX_ELEMS, "16-bit elements: a 64-element box row is the swizzle's 128 bytes");
    const CUtensorMapDataType type = std::is_same<T, __nv_bfloat16>::value ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                                                             : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    return tma_map_sw128(map, type, 2, base, heads, N, d, box_rows, why, n);
}

/* The same for a [heads][rows][cols] tensor of bytes (stage 19's e4m3 Q, K and V^T): a box of
 * box_rows rows by 128 columns, so a tile of `cols` bytes a row is cols / 128 copies, each into
 * its column block. */
static inline int tma_map_bytes(CUtensorMap *map, const uint8_t *base, long long heads, int rows, int cols, int box_rows,
                                char *why, size_t n)
{
    return tma_map_sw128(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, base, heads, rows, cols, box_rows, why, n);
}

/* ---- the bulk tensor copy (device) ---- */

static __device__ __forceinline__ unsigned smem_u32(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

/* Fetches the tensor map into the copy engine's cache ahead of the first copy (a hint). */
static __device__ __forceinline__ void tma_prefetch_map(const CUtensorMap *map)
{
    asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)map) : "memory");
}

/* One thread: the box at coordinates (c0, c1, c2), innermost first (for tma_map_heads: column,
 * row, head), into shared memory at dst (1024-byte aligned for the 128-byte swizzle); its bytes
 * count against bar's current phase as they land. The caller has announced them to bar with
 * mbar_arrive_expect_tx. */
static __device__ __forceinline__ void tma_load_3d(void *dst, const CUtensorMap *map, uint64_t *bar, int c0, int c1,
                                                   int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
                 : "memory");
}

/* One thread: `bytes` contiguous bytes (a multiple of 16; both addresses 16-byte aligned) from
 * global memory at src into shared memory at dst, by the copy engine, with no tensor map; the bytes
 * count against bar's current phase as they land, as tma_load_3d's do. Plain compute capability
 * 9.0 has it (sm_90, not only sm_90a). */
static __device__ __forceinline__ void bulk_load_1d(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(smem_u32(dst)), "l"((uint64_t)src), "r"(bytes), "r"(smem_u32(bar))
                 : "memory");
}

/* ---- the bulk reduce-add (device): shared memory added into global memory by the copy engine ----
 *
 * One thread: `bytes` contiguous bytes of fp32 in shared memory at src (a multiple of 16; both
 * addresses 16-byte aligned) added element by element into global memory at dst, the additions
 * made in the L2 cache like atomics (so blocks adding into the same dst need no other ordering
 * for a correct sum). The copy is tracked by *bulk groups* of the issuing thread, not by an
 * mbarrier: bulk_commit closes a group; bulk_wait_read<N> returns once at most N groups are still
 * reading their shared memory (src may then be overwritten); bulk_wait<N> once at most N are
 * unfinished at all (their writes done). The shared memory was written by ordinary stores: the
 * writers fence (fence_proxy_async_smem) before the barrier that hands it to this thread. Stage 16
 * adds each block's fp32 dQ tile this way. Plain compute capability 9.0. */
static __device__ __forceinline__ void bulk_reduce_add_f32(float *dst, const float *src, unsigned bytes)
{
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n"
                 ::"l"((uint64_t)dst), "r"(smem_u32(src)), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void bulk_commit()
{
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}
template <int N>
static __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
template <int N>
static __device__ __forceinline__ void bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Between this thread's ordinary accesses to global memory and the copy engine's (the async
 * proxy's) that come after it, in program order: a bulk copy issued after it sees what the
 * ordinary accesses before it saw, and the other way round. */
static __device__ __forceinline__ void fence_proxy_async_global()
{
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

/* A 32-bit load from global memory with acquire semantics at GPU scope: what the writer released
 * before the value it stored (an atomic with release, or a store after __threadfence) is visible
 * after this load returns it. */
static __device__ __forceinline__ int ld_acquire_gpu(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"((uint64_t)p) : "memory");
    return v;
}

/* ---- the mbarrier (device) ---- */

/* One thread, before any use: the barrier expects `count` arrivals per phase. */
static __device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

/* After the inits, by the thread that made them: they are visible to the copy engine (the async
 * proxy) too. A __syncthreads() after it publishes them to the other threads. */
static __device__ __forceinline__ void mbar_fence_init()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

/* One arrival on the current phase (release: this thread's earlier memory operations, and the
 * wgmma it waited for, are done before the phase can complete). */
static __device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_u32(bar))
                 : "memory");
}

/* One arrival, and `bytes` more transaction bytes the current phase waits for (the copies about to
 * be issued against it). */
static __device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, unsigned bytes)
{
    asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n"
                 ::"r"(smem_u32(bar)), "r"(bytes)
                 : "memory");
}

/* `bytes` more transaction bytes for the current phase, without an arrival: a producer that
 * announces its copies, issues them, and only then arrives (mbar_arrive), so that in program order
 * the copies come before the arrival the consumers' wait pairs with. (Stage 16's producer: the
 * consumers read what the bulk copies bring with ordinary loads, and compute-sanitizer's racecheck
 * orders those loads after the copies only through that arrival.) */
static __device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes)
{
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

/* Has the phase of parity `parity` completed? The thread may be suspended a while (a limit the
 * hardware sets) before the answer is no; acquire: on yes, what the phase's arrivals released and
 * the bytes its copies wrote are visible to this thread. */
static __device__ __forceinline__ bool mbar_try_wait(uint64_t *bar, unsigned parity)
{
    unsigned done;
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_u32(bar)), "r"(parity)
                 : "memory");
    return done != 0;
}

/* Waits until the phase of parity `parity` has completed. */
static __device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity)
{
    while (!mbar_try_wait(bar, parity)) {
    }
}

/* ---- registers and barriers for warp-specialized blocks (device) ---- */

/* Every thread of a warpgroup, together: the warpgroup's registers per thread become REGS (a
 * multiple of 8, 24 to 256). dec gives registers back to the block's pool; inc waits until the pool
 * has enough and takes them. The kernel must start with a known register count (__launch_bounds__
 * (threads, 1): 65536 / threads, rounded down to a multiple of 8), and what the warpgroups take in
 * the end must not exceed what the block started with, or an inc waits forever. */
template <int REGS>
static __device__ __forceinline__ void setmaxnreg_dec()
{
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg: a multiple of 8 in 24 .. 256");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
static __device__ __forceinline__ void setmaxnreg_inc()
{
    static_assert(REGS % 8 == 0 && REGS >= 24 && REGS <= 256, "setmaxnreg: a multiple of 8 in 24 .. 256");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}

/* A barrier among `threads` threads of the block (a multiple of 32, whole warps), the hardware
 * barrier `id` (1 to 15; 0 is __syncthreads'): once some warps have left or work elsewhere, the
 * others meet here without them. */
static __device__ __forceinline__ void named_barrier_sync(int id, int threads)
{
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

/* The other half of a named barrier: these warps count towards barrier `id`'s `threads` and go on
 * without waiting; the warps that bar.sync there are released once the count is reached. A
 * signal from one group of warps to another (stage 13: "your turn"), where named_barrier_sync on
 * both sides would hold the signalling warps as well. Each phase needs its arrivals and its
 * syncs to add up to `threads` exactly: an arrival too many completes a phase early. */
static __device__ __forceinline__ void named_barrier_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#endif
