/* wgmma.cuh: Hopper's warpgroup tensor-core MMA (wgmma) and the shared-memory layout it reads
 * (stage 11). sm_90a only: compile with -gencode arch=compute_90a,code=sm_90a; the code runs on
 * compute capability 9.0 alone (H100, H200).
 *
 * A warpgroup is four consecutive warps, the first of them a multiple of 4 (warps 0-3, 4-7, ...):
 * 128 threads that issue one wgmma together. One wgmma.m64nNk16 computes D (64 x N, fp32) += A
 * (64 x 16) * B (16 x N); B always comes from shared memory, through a 64-bit matrix descriptor;
 * A from shared memory too (the "SS" form) or from registers (the "RS" form). It is asynchronous:
 * the warpgroup issues it and goes on; wgmma_commit() closes a group of issued wgmma and
 * wgmma_wait<N>() waits until at most N groups are still running. Only then may the accumulator
 * registers be read, the A registers be rewritten, or the shared memory be overwritten.
 *
 * Which thread holds which element. In a warpgroup, warp w = (threadIdx.x / 32) % 4 owns rows
 * 16w .. 16w+15 of the 64; within the warp, g = lane >> 2 and t = lane & 3 as in mma.cuh.
 *   D (fp32, float d[N/8][4]): per n8 column tile nt, the mma.sync C layout of mma.cuh:
 *     d[nt][0], d[nt][1] = D[16w + g    ][8nt + 2t], D[16w + g    ][8nt + 2t + 1]
 *     d[nt][2], d[nt][3] = D[16w + g + 8][8nt + 2t], D[16w + g + 8][8nt + 2t + 1]
 *
 *             columns: 8nt+0,1   8nt+2,3   8nt+4,5   8nt+6,7
 *     row 16w + g       t=0       t=1       t=2       t=3       <- d[nt][0..1]
 *     row 16w + g + 8   t=0       t=1       t=2       t=3       <- d[nt][2..3]
 *     (g = 0..7 picks the row within each half; 4 warps x 16 rows = the 64 rows)
 *
 *   A from registers (RS form, 16-bit): per k16 step, four 32-bit registers, the mma.sync A
 *     fragment of mma.cuh on the warp's 16 rows: a[0] = A[16w+g][2t, 2t+1], a[1] = A[16w+g+8][2t,
 *     2t+1], a[2] = A[16w+g][2t+8, 2t+9], a[3] = A[16w+g+8][2t+8, 2t+9]. As with mma.sync, the D
 *     layout of two adjacent n8 tiles, packed to 16 bits, is the A layout of one k16 step: P stays
 *     in registers.
 */
#ifndef WGMMA_CUH
#define WGMMA_CUH

#include "common/cuda/mma.cuh"
#include "common/cuda/swizzle.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <type_traits>

/* ---- the 128-byte swizzled layout ----
 *
 * wgmma reads its shared-memory operands in a few fixed ("canonical") layouts; this project uses
 * one, the 128-byte swizzle, for every operand. Its unit is an atom of 8 rows of 128 bytes (64
 * 16-bit elements), 1024 bytes, at a 1024-byte-aligned address. Within an atom, 16-byte chunk c of
 * row r is stored at chunk c ^ r:
 *
 *   byte   0       16      32      48      64      80      96      112
 *   row 0  c0      c1      c2      c3      c4      c5      c6      c7
 *   row 1  c1      c0      c3      c2      c5      c4      c7      c6
 *   row 2  c2      c3      c0      c1      c6      c7      c4      c5
 *   row 3  c3      c2      c1      c0      c7      c6      c5      c4
 *   row 4  c4      c5      c6      c7      c0      c1      c2      c3
 *   row 5  c5      c4      c7      c6      c1      c0      c3      c2
 *   row 6  c6      c7      c4      c5      c2      c3      c0      c1
 *   row 7  c7      c6      c5      c4      c3      c2      c1      c0
 *
 * (the same XOR as stage 9's swizzle.cuh, but the hardware applies it to address bits: bits 4-6 of
 * the byte address are XORed with bits 7-9, which is why the atoms must be 1024-byte aligned.) A
 * column of 8 chunks, one from each row, covers the 8 16-byte bank groups once: conflict-free.
 *
 * A tile of ROWS rows of ROW_ELEMS elements (ROW_ELEMS a multiple of 64) is stored as ROW_ELEMS / 64
 * column blocks, each ROWS rows of 128 bytes (consecutive atoms down the rows):
 *   element (r, col) -> block col / 64, row r of it, chunk (col % 64) / 8, element col % 8.
 * A row of the matrix is thus split over the blocks (d = 128: two 128-byte halves ROWS * 128 bytes
 * apart), because an atom's rows must be exactly 128 bytes apart. */

#define SW128_ROW_BYTES 128   /* one row of an atom: 64 16-bit elements */
#define SW128_ATOM_BYTES 1024 /* 8 rows: the unit of the swizzle, and the alignment it needs */

/* Element offset of logical 16-byte chunk `chunk` (0 .. ROW_ELEMS/8 - 1) of row `row`. */
template <int ROWS>
static __device__ __forceinline__ int sw128(int row, int chunk)
{
    const int block = chunk >> 3, c = chunk & 7;
    return block * ROWS * 64 + row * 64 + ((c ^ (row & 7)) << 3);
}

/* Rows row0 .. row0+ROWS-1 of one head's [N, ROW_ELEMS] matrix of T into a 128-byte-swizzled tile,
 * 16 bytes per cp.async, spread over the block's NTHREADS threads (the caller commits the group).
 * Consecutive threads take consecutive chunks of a row: coalesced reads, and the 8 chunks a row
 * has in a block land in 8 different bank groups. Rows at or past N are zero-filled. */
template <typename T, int ROW_ELEMS, int ROWS, int NTHREADS>
static __device__ __forceinline__ void load_tile_sw128(void *tile, const T *src, int row0, int N)
{
    static_assert(ROW_ELEMS % 64 == 0 && ROWS % 8 == 0, "whole 8 x 64 atoms");
    load_tile_laid_out<T, ROW_ELEMS, ROWS, NTHREADS>(tile, src, row0, N,
                                                     [](int r, int chunk) { return sw128<ROWS>(r, chunk); });
}

/* The same copy for a tile loaded again and again (stage 11's K_j and V_j), each thread's addresses
 * worked out once, as swizzled_tile_loader (swizzle.cuh) does for stage 9's layout: thread tid
 * copies logical chunk tid mod CHUNKS of rows tid / CHUNKS + k ROW_STEP. ROW_STEP being whole
 * 8-row atoms, the k-th copy lands ROW_STEP rows of 128 bytes further down the same column block,
 * a compile-time offset in shared memory as in HBM. Where the block's threads do not divide the
 * tile that way, the copy falls back to load_tile_sw128. */
template <typename T, int ROW_ELEMS, int ROWS, int NTHREADS>
struct sw128_tile_loader {
    static constexpr int CHUNKS = ROW_ELEMS / 8, ROW_STEP = NTHREADS / CHUNKS, COPIES = ROWS / (ROW_STEP > 0 ? ROW_STEP : 1);
    static constexpr bool HOISTED = NTHREADS % CHUNKS == 0 && ROW_STEP > 0 && ROWS % ROW_STEP == 0 && ROW_STEP % 8 == 0;
    static_assert(sizeof(T) == 2 && ROW_ELEMS % 64 == 0 && ROWS % 8 == 0, "whole 8 x 64 atoms of 16-bit elements");
    int row;  /* this thread's first row in the tile */
    int from; /* its first element in the tile's rows of the source: row * ROW_ELEMS + chunk * 8 */
    int to;   /* its first element in the swizzled tile */
    __device__ __forceinline__ sw128_tile_loader()
    {
        const int chunk = threadIdx.x % CHUNKS;
        row = threadIdx.x / CHUNKS;
        from = row * ROW_ELEMS + chunk * 8;
        to = sw128<ROWS>(row, chunk);
    }
    /* Rows row0 .. row0+ROWS-1 of one head's [N, ROW_ELEMS] matrix `src` into `tile`, as
     * load_tile_sw128: rows at or past N are zero-filled, and never read from HBM. */
    __device__ __forceinline__ void load(void *tile, const T *src, int row0, int N) const
    {
        if constexpr (!HOISTED) {
            load_tile_sw128<T, ROW_ELEMS, ROWS, NTHREADS>(tile, src, row0, N);
        } else {
            T *dst = (T *)tile + to;
            if (row0 + ROWS <= N) { /* the whole tile lies before N (the same branch for every thread) */
                const T *at = src + (size_t)row0 * ROW_ELEMS + from;
#pragma unroll
                for (int k = 0; k < COPIES; k++) cp_async_16(dst + k * ROW_STEP * 64, at + k * ROW_STEP * ROW_ELEMS);
            } else {
#pragma unroll
                for (int k = 0; k < COPIES; k++) {
                    const bool valid = row0 + row + k * ROW_STEP < N;
                    const size_t at = valid ? (size_t)row0 * ROW_ELEMS + from + k * ROW_STEP * ROW_ELEMS : 0;
                    cp_async_16_zfill(dst + k * ROW_STEP * 64, src + at, valid);
                }
            }
        }
    }
};

/* ---- the shared-memory matrix descriptor ----
 *
 * 64 bits that tell wgmma where an operand lies and how (PTX ISA, "Matrix Descriptor Format"):
 *   bits  0-13  start address >> 4  (a 32-bit shared-memory address, 16-byte aligned)
 *   bits 16-29  leading dimension byte offset >> 4  (LBO)
 *   bits 32-45  stride dimension byte offset >> 4   (SBO)
 *   bits 49-51  base offset: 0, the atoms being 1024-byte aligned
 *   bits 62-63  swizzle mode: 1 = 128-byte swizzle (2 = 64-byte, 3 = 32-byte, 0 = none)
 * What LBO and SBO mean depends on which dimension is contiguous (PTX ISA, "Shared Memory Matrix
 * Layout"), for the 128-byte swizzle:
 *   K-major (rows along M or N, each row contiguous in k: Q for A, K_j for B in S = Q K^T):
 *     SBO = 1024, from one 8-row atom to the next down M (or N); LBO unused (one k16 step, 32
 *     bytes, lies inside a 128-byte row), set to 1 as CUTLASS does. The k16 steps within a
 *     128-byte row are start + 32, + 64, + 96 bytes: the hardware swizzles the address it forms,
 *     so stepping the start inside the atom reads the right chunks.
 *   MN-major (rows along K, each contiguous in N: V_j [keys][d] for B in O = P V, "transposed"):
 *     SBO = 1024, from one group of 8 k rows to the next; LBO = from one 64-column block of N to
 *     the next (ROWS * 128 bytes in the tile above). A k16 step is start + 2048 (16 rows of 128).
 * The step arithmetic adds (bytes >> 4) to the low bits: the address field never carries (shared
 * addresses stay below 2^18). */
static __device__ __forceinline__ uint64_t wgmma_desc(unsigned smem_addr, unsigned lbo_bytes, unsigned sbo_bytes)
{
    const uint64_t swizzle_128b = 1;
    return (uint64_t)((smem_addr & 0x3FFFF) >> 4) | (uint64_t)((lbo_bytes >> 4) & 0x3FFF) << 16 |
           (uint64_t)((sbo_bytes >> 4) & 0x3FFF) << 32 | swizzle_128b << 62;
}

/* A K-major operand (A, or B stored [N][K]) whose first row starts at smem_addr. */
static __device__ __forceinline__ uint64_t wgmma_desc_kmajor(unsigned smem_addr)
{
    return wgmma_desc(smem_addr, 16, SW128_ATOM_BYTES);
}

/* An MN-major operand (B stored [K][N], or A stored [K][M] for wgmma_ss's TRANS_A) whose column
 * blocks lie block_bytes apart. */
static __device__ __forceinline__ uint64_t wgmma_desc_mnmajor(unsigned smem_addr, unsigned block_bytes)
{
    return wgmma_desc(smem_addr, block_bytes, SW128_ATOM_BYTES);
}

/* The same descriptor with its start `bytes` further on (a multiple of 16). */
static __device__ __forceinline__ uint64_t wgmma_desc_step(uint64_t desc, unsigned bytes)
{
    return desc + (bytes >> 4);
}

/* Where k16 step kk starts, in bytes from the operand's first row (the rules above), in a tile
 * stored as load_tile_sw128 stores it:
 *   K-major, ROWS rows (along M or N) per column block: block kk / 4, then 32 bytes per step;
 *   MN-major (rows along K): 16 rows of 128 bytes per step. */
template <int ROWS>
static __device__ __forceinline__ constexpr unsigned sw128_kmajor_step(int kk)
{
    return (kk / 4) * ROWS * SW128_ROW_BYTES + (kk % 4) * 32;
}
static __device__ __forceinline__ constexpr unsigned sw128_mnmajor_step(int kk)
{
    return kk * 16 * SW128_ROW_BYTES;
}

/* ---- ordering ---- */

/* Shared memory written through the generic proxy (ordinary stores, and cp.async) is read by
 * wgmma through the async proxy: each writing thread fences after its writes complete and before
 * the barrier that publishes them (cp_async_wait, then this, then __syncthreads). */
static __device__ __forceinline__ void fence_proxy_async_smem()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

/* Before the first wgmma of a batch: the registers it reads (accumulators, A fragments), written
 * by ordinary instructions, are ready for the tensor cores. */
static __device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

/* Closes the group of wgmma this warpgroup issued since the last commit. */
static __device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/* Waits until at most N committed groups of this warpgroup are still running. */
template <int N>
static __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* wgmma_wait<N>() where it is written, not earlier. ptxas (CUDA 13.0) schedules wgmma.wait_group
 * like an instruction without operands: within its basic block it may rise to any point after the
 * wgmma it waits for, and it does, above independent work the source put before it (stage 13: the
 * softmax meant to run under its P V, waited for after it). It does not rise into an earlier block,
 * so a branch ptxas cannot remove goes first: on `never`, a warp-uniform value that is never -1
 * (a tile counter), always taken, over a nanosleep that never runs. Two instructions. */
template <int N>
static __device__ __forceinline__ void wgmma_wait_here(int never)
{
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.s32 p, %0, -1;\n\t@p bra.uni WAIT_%=;\n\tnanosleep.u32 0;\n"
                 "WAIT_%=:\n\t}\n" ::"r"(never)
                 : "memory");
    wgmma_wait<N>();
}

/* The compiler sees a wgmma as an ordinary instruction that reads and writes its registers where
 * it is issued, not as work running until the wait. wgmma_hold on the accumulators (or on an A
 * fragment) pins them at that point (CUTLASS's warpgroup_fence_operand); it emits no instruction.
 *   right before wgmma_fence: every ordinary write of them is done before the fence;
 *   right after wgmma_wait: no read of the results is moved above the wait, and no A register is
 *     reused for something else while the tensor cores may still read it. */
template <int NT>
static __device__ __forceinline__ void wgmma_hold(float (&d)[NT][4])
{
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) asm volatile("" : "+f"(d[i][c])::"memory");
}
template <int NT>
static __device__ __forceinline__ void wgmma_hold(uint32_t (&a)[NT][4])
{
#pragma unroll
    for (int i = 0; i < NT; i++)
#pragma unroll
        for (int c = 0; c < 4; c++) asm volatile("" : "+r"(a[i][c])::"memory");
}

/* ---- wgmma.mma_async m64nNk16, fp32 accumulators, fp16 or bf16 inputs ----
 *
 * wgmma_ss<T, N, TRANS_B>(d, desc_a, desc_b, accumulate):  D = A * B (+ D), A and B in shared memory
 * wgmma_rs<T, N, TRANS_B>(d, a, desc_b, accumulate):       the same with A from registers a[4]
 * wgmma_ss<T, N, TRANS_B, TRANS_A>: A in shared memory MN-major (TRANS_A = 1: stored [K][M], each
 *             row of k contiguous along M, the layout of V_j as a B operand), for 16-bit types; the
 *             backward (stage 16) reads dS this way from the dS^T tile it wrote
 *   T:        __half or __nv_bfloat16 (the layouts are the same; only the instruction differs)
 *   N:        64, 128 or 256 columns (the shapes the stages use); d is float[N / 8][4]
 *   TRANS_B:  0 when B is K-major (stored [N][K], like K_j in S = Q K^T), 1 when B is MN-major
 *             (stored [K][N], like V_j in O = P V): the instruction's imm-trans-b, allowed for
 *             16-bit types. A from registers is always K-major; from shared memory, TRANS_A picks
 *             (imm-trans-a, 0 by default).
 *   accumulate: 0 makes D = A * B (the scale-d predicate: no need to zero D first), else D += A * B.
 * The PTX operand numbers are literal, so each shape is written out: the accumulators are %0 ..
 * %(N/2 - 1), the other operands follow. */
#define WG_REGS_32 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define WG_REGS_64 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define WG_REGS_128 \
    "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}"
/* the accumulators of n8 tile nt, and of eight tiles from nt */
#define WG_ACC_1(d, nt) "+f"(d[nt][0]), "+f"(d[nt][1]), "+f"(d[nt][2]), "+f"(d[nt][3])
#define WG_ACC_8(d, nt) WG_ACC_1(d, nt), WG_ACC_1(d, nt + 1), WG_ACC_1(d, nt + 2), WG_ACC_1(d, nt + 3), \
                        WG_ACC_1(d, nt + 4), WG_ACC_1(d, nt + 5), WG_ACC_1(d, nt + 6), WG_ACC_1(d, nt + 7)
#define WG_ACC_N64(d) WG_ACC_8(d, 0)
#define WG_ACC_N128(d) WG_ACC_8(d, 0), WG_ACC_8(d, 8)
#define WG_ACC_N256(d) WG_ACC_8(d, 0), WG_ACC_8(d, 8), WG_ACC_8(d, 16), WG_ACC_8(d, 24)
/* SS: operands after the accumulators are desc_a (DA), desc_b (DB), accumulate (P), TRANS_B (TB),
 * TRANS_A (TA) */
#define WG_SS(N, TY, REGS, DA, DB, P, TB, TA) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " REGS ", " DA ", " DB ", p, 1, 1, " TA ", " TB ";\n}\n"
/* RS: a[0..3] (A0 = "%k, %k+1, %k+2, %k+3"), desc_b (DB), accumulate (P), TRANS_B (TB) */
#define WG_RS(N, TY, REGS, A0, DB, P, TB) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " REGS ", {" A0 "}, " DB ", p, 1, 1, " TB ";\n}\n"
#define WG_SS_IN "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TRANS_B), "n"(TRANS_A)
#define WG_RS_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate), "n"(TRANS_B)

template <typename T, int N, int TRANS_B, int TRANS_A = 0>
static __device__ __forceinline__ void wgmma_ss(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_ss: N = 64, 128 or 256");
    static_assert(TRANS_B == 0 || TRANS_B == 1, "TRANS_B: 0 (B K-major) or 1 (B MN-major)");
    static_assert(TRANS_A == 0 || TRANS_A == 1, "TRANS_A: 0 (A K-major) or 1 (A MN-major)");
    constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
    static_assert(BF16 || std::is_same<T, __half>::value, "fp16 or bf16");
    if constexpr (N == 64 && !BF16)
        asm volatile(WG_SS(64, "f16", WG_REGS_32, "%32", "%33", "%34", "%35", "%36") : WG_ACC_N64(d) : WG_SS_IN);
    else if constexpr (N == 64)
        asm volatile(WG_SS(64, "bf16", WG_REGS_32, "%32", "%33", "%34", "%35", "%36") : WG_ACC_N64(d) : WG_SS_IN);
    else if constexpr (N == 128 && !BF16)
        asm volatile(WG_SS(128, "f16", WG_REGS_64, "%64", "%65", "%66", "%67", "%68") : WG_ACC_N128(d) : WG_SS_IN);
    else if constexpr (N == 128)
        asm volatile(WG_SS(128, "bf16", WG_REGS_64, "%64", "%65", "%66", "%67", "%68") : WG_ACC_N128(d) : WG_SS_IN);
    else if constexpr (!BF16)
        asm volatile(WG_SS(256, "f16", WG_REGS_128, "%128", "%129", "%130", "%131", "%132") : WG_ACC_N256(d) : WG_SS_IN);
    else
        asm volatile(WG_SS(256, "bf16", WG_REGS_128, "%128", "%129", "%130", "%131", "%132") : WG_ACC_N256(d) : WG_SS_IN);
}

template <typename T, int N, int TRANS_B>
static __device__ __forceinline__ void wgmma_rs(float (&d)[N / 8][4], const uint32_t a[4], uint64_t desc_b, int accumulate)
{
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_rs: N = 64, 128 or 256");
    static_assert(TRANS_B == 0 || TRANS_B == 1, "TRANS_B: 0 (B K-major) or 1 (B MN-major)");
    constexpr bool BF16 = std::is_same<T, __nv_bfloat16>::value;
    static_assert(BF16 || std::is_same<T, __half>::value, "fp16 or bf16");
    if constexpr (N == 64 && !BF16)
        asm volatile(WG_RS(64, "f16", WG_REGS_32, "%32, %33, %34, %35", "%36", "%37", "%38") : WG_ACC_N64(d) : WG_RS_IN);
    else if constexpr (N == 64)
        asm volatile(WG_RS(64, "bf16", WG_REGS_32, "%32, %33, %34, %35", "%36", "%37", "%38") : WG_ACC_N64(d) : WG_RS_IN);
    else if constexpr (N == 128 && !BF16)
        asm volatile(WG_RS(128, "f16", WG_REGS_64, "%64, %65, %66, %67", "%68", "%69", "%70") : WG_ACC_N128(d) : WG_RS_IN);
    else if constexpr (N == 128)
        asm volatile(WG_RS(128, "bf16", WG_REGS_64, "%64, %65, %66, %67", "%68", "%69", "%70") : WG_ACC_N128(d) : WG_RS_IN);
    else if constexpr (!BF16)
        asm volatile(WG_RS(256, "f16", WG_REGS_128, "%128, %129, %130, %131", "%132", "%133", "%134") : WG_ACC_N256(d) : WG_RS_IN);
    else
        asm volatile(WG_RS(256, "bf16", WG_REGS_128, "%128, %129, %130, %131", "%132", "%133", "%134") : WG_ACC_N256(d) : WG_RS_IN);
}

#undef WG_SS_IN
#undef WG_RS_IN

/* ---- wgmma.mma_async m64nNk32, fp32 accumulators, FP8 e4m3 inputs ----
 *
 * Hopper's tensor cores take 8-bit floats at twice the 16-bit rate: one wgmma covers k = 32, the
 * same 32 bytes of each row as a 16-bit k16 step, so the 128-byte swizzle, the descriptors and the
 * byte steps (sw128_kmajor_step) are the 16-bit ones, a 128-byte row holding 128 elements. Two
 * rules differ:
 *   - both operands K-major: 8-bit types have no transpose (no imm-trans), so the B of O = P V
 *     must be stored V^T, [d][keys];
 *   - A from registers (RS) packs four elements a register: per k32 step, with w, g, t as above,
 *       a[0] = A[16w + g    ][4t .. 4t + 3]        a[1] = A[16w + g + 8][4t .. 4t + 3]
 *       a[2] = A[16w + g    ][16 + 4t .. 19 + 4t]  a[3] = A[16w + g + 8][16 + 4t .. 19 + 4t]
 *     (byte i of a register the column + i). This is not the D layout of two n8 tiles (which gives
 *     a thread columns 2t, 2t + 1 of each): P from the accumulators must be permuted to feed P V.
 * wgmma_ss_e4m3<N>(d, desc_a, desc_b, accumulate), wgmma_rs_e4m3<N>(d, a, desc_b, accumulate):
 * D (+)= A * B as wgmma_ss and wgmma_rs, N = 64, 128 or 256. */
#define WG_SS8(N, REGS, DA, DB, P) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " REGS ", " DA ", " DB ", p, 1, 1;\n}\n"
#define WG_RS8(N, REGS, A0, DB, P) \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " P ", 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " REGS ", {" A0 "}, " DB ", p, 1, 1;\n}\n"
#define WG_SS8_IN "l"(desc_a), "l"(desc_b), "r"(accumulate)
#define WG_RS8_IN "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate)

template <int N>
static __device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[N / 8][4], uint64_t desc_a, uint64_t desc_b, int accumulate)
{
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_ss_e4m3: N = 64, 128 or 256");
    if constexpr (N == 64)
        asm volatile(WG_SS8(64, WG_REGS_32, "%32", "%33", "%34") : WG_ACC_N64(d) : WG_SS8_IN);
    else if constexpr (N == 128)
        asm volatile(WG_SS8(128, WG_REGS_64, "%64", "%65", "%66") : WG_ACC_N128(d) : WG_SS8_IN);
    else
        asm volatile(WG_SS8(256, WG_REGS_128, "%128", "%129", "%130") : WG_ACC_N256(d) : WG_SS8_IN);
}

template <int N>
static __device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[N / 8][4], const uint32_t a[4], uint64_t desc_b, int accumulate)
{
    static_assert(N == 64 || N == 128 || N == 256, "wgmma_rs_e4m3: N = 64, 128 or 256");
    if constexpr (N == 64)
        asm volatile(WG_RS8(64, WG_REGS_32, "%32, %33, %34, %35", "%36", "%37") : WG_ACC_N64(d) : WG_RS8_IN);
    else if constexpr (N == 128)
        asm volatile(WG_RS8(128, WG_REGS_64, "%64, %65, %66, %67", "%68", "%69") : WG_ACC_N128(d) : WG_RS8_IN);
    else
        asm volatile(WG_RS8(256, WG_REGS_128, "%128, %129, %130, %131", "%132", "%133") : WG_ACC_N256(d) : WG_RS8_IN);
}

/* Four floats to four e4m3 in one register, x0 in the low byte (round to nearest even, saturated
 * to +-448, as the host's f32_to_e4m3): cvt.rn.satfinite.e4m3x2.f32 puts its first source in the
 * high byte of the pair. */
static __device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3)
{
    uint16_t lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
    return (uint32_t)lo | (uint32_t)hi << 16;
}

#undef WG_SS8_IN
#undef WG_RS8_IN

#endif
