/* swizzle.cuh: swizzled shared-memory tiles and the ldmatrix addresses into them (stage 9's
 * forward and stage 10's backward; the PTX itself is in mma.cuh).
 *
 * A tile is ROWS rows of ROW_ELEMS 16-bit elements (fp16 or bf16: ldmatrix and cp.async move bit
 * patterns, so one layout serves both), stored with no padding. A row is ROW_ELEMS / 8 chunks of
 * 16 bytes, the unit of one cp.async and of one ldmatrix row.
 *
 * Why swizzle. Shared memory is 32 banks of 4 bytes: a 128-byte line covers each bank once, as 8
 * groups of 4 banks, 16 bytes each. An ldmatrix matrix is one chunk from each of 8 consecutive
 * rows, and it is conflict-free only if those 8 chunks sit in 8 different 16-byte groups. With
 * plain rows of 128 or 256 bytes (d = 64, 128) all 8 land in the same group: an 8-way conflict.
 * Stages 4 to 8 pad each row by 16 bytes; here logical chunk c of row r is stored at chunk
 * c ^ f(r) of the same row instead, which keeps the tile dense:
 *   rows of 8 or more chunks (ROW_ELEMS >= 64):  f(r) = r mod 8, so over any 8 consecutive rows
 *     the chunk's group, (c mod 8) ^ f(r), takes 8 different values;
 *   rows of 4 chunks (ROW_ELEMS = 32, two rows to a 128-byte line):  f(r) = (r / 2) mod 4, so
 *     the chunk's group is 4 (r mod 2) + (c ^ f(r)): the half of the line from the row's parity,
 *     the group within it from f, again 8 different values over any 8 consecutive rows.
 * The XOR only permutes chunks within their own 128-byte line, so cp.async writes are
 * conflict-free too: the 8 threads served together (16 bytes each) write 8 consecutive chunks of
 * the tile, one line's worth, to its 8 groups.
 */
#ifndef SWIZZLE_CUH
#define SWIZZLE_CUH

#include "common/cuda/defs.cuh"
#include "common/cuda/mma.cuh"

#include <stddef.h>
#include <stdint.h>

/* ---- the swizzle ---- */

/* The element offset of logical 16-byte chunk `chunk` of row `row` in a swizzled tile of rows of
 * ROW_ELEMS elements (the f above). */
template <int ROW_ELEMS>
static __device__ __forceinline__ int swizzle(int row, int chunk)
{
    constexpr int CHUNKS = ROW_ELEMS / 8; /* 16-byte chunks per row */
    static_assert(CHUNKS % 8 == 0 || CHUNKS == 4, "the swizzle needs rows of 32 elements or a multiple of 64");
    const int f = CHUNKS >= 8 ? (row & 7) : ((row / (8 / CHUNKS)) & (CHUNKS - 1));
    return row * ROW_ELEMS + ((chunk ^ f) << 3);
}

/* Rows row0 .. row0+ROWS-1 of one head's [N, ROW_ELEMS] matrix of T into a shared tile whose
 * layout `offset(row, chunk)` gives (the element offset of 16-byte chunk `chunk` of tile row
 * `row`), 16 bytes per cp.async, spread over the block's NTHREADS threads (the caller commits the
 * group). Consecutive threads take consecutive chunks of a row, so the reads from HBM coalesce.
 * Rows at or past N are zero-filled, and never read from HBM. Both swizzled layouts load this way:
 * this file's (load_tile_swizzled) and wgmma's 128-byte one (load_tile_sw128 in wgmma.cuh). */
template <typename T, int ROW_ELEMS, int ROWS, int NTHREADS, typename Offset>
static __device__ __forceinline__ void load_tile_laid_out(void *tile, const T *src, int row0, int N, Offset offset)
{
    static_assert(sizeof(T) == 2, "swizzled tiles hold 16-bit elements");
    constexpr int CHUNKS = ROW_ELEMS / 8;
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += NTHREADS) {
        const int r = c / CHUNKS, chunk = c % CHUNKS;
        const bool valid = row0 + r < N;
        const T *from = src + (size_t)(valid ? row0 + r : 0) * ROW_ELEMS + chunk * 8;
        cp_async_16_zfill((T *)tile + offset(r, chunk), from, valid);
    }
}

/* ... into this file's swizzled layout. */
template <typename T, int ROW_ELEMS, int ROWS, int NTHREADS>
static __device__ __forceinline__ void load_tile_swizzled(void *tile, const T *src, int row0, int N)
{
    load_tile_laid_out<T, ROW_ELEMS, ROWS, NTHREADS>(tile, src, row0, N,
                                                     [](int r, int chunk) { return swizzle<ROW_ELEMS>(r, chunk); });
}

/* The same copy for a tile loaded again and again (stage 10's Q_i and dO_i, on every step), with
 * each thread's addresses worked out once (the block has exactly NTHREADS threads). When NTHREADS
 * is a multiple of the chunks per row, thread `tid` always copies logical chunk tid mod CHUNKS,
 * of rows tid / CHUNKS + k ROW_STEP (ROW_STEP = NTHREADS / CHUNKS): one chunk column, so its k-th
 * copy is its first plus a compile-time offset in HBM, and, ROW_STEP being whole 8-row groups
 * (f(r) repeats every 8 rows, and every 2 x 4 rows in 4-chunk rows), plus a compile-time offset
 * in shared memory too. A whole tile (no row at or past N) then costs one cp.async per copy; only
 * a tail tile tests its rows. */
template <typename T, int ROW_ELEMS, int ROWS, int NTHREADS>
struct swizzled_tile_loader {
    static constexpr int CHUNKS = ROW_ELEMS / 8, ROW_STEP = NTHREADS / CHUNKS, COPIES = ROWS / ROW_STEP;
    static_assert(sizeof(T) == 2, "swizzled tiles hold 16-bit elements");
    static_assert(NTHREADS % CHUNKS == 0 && ROWS % ROW_STEP == 0 && ROW_STEP % 8 == 0,
                  "every thread copies one chunk column, in whole 8-row groups, of every tile");
    int row;  /* this thread's first row in the tile */
    int from; /* its first element in the tile's rows of the source: row * ROW_ELEMS + chunk * 8 */
    int to;   /* its first element in the swizzled tile */
    __device__ __forceinline__ swizzled_tile_loader()
    {
        const int chunk = threadIdx.x % CHUNKS;
        row = threadIdx.x / CHUNKS;
        from = row * ROW_ELEMS + chunk * 8;
        to = swizzle<ROW_ELEMS>(row, chunk);
    }
    /* Rows row0 .. row0+ROWS-1 of one head's [N, ROW_ELEMS] matrix `src` into `tile`, as
     * load_tile_swizzled: rows at or past N are zero-filled, and never read from HBM. */
    __device__ __forceinline__ void load(void *tile, const T *src, int row0, int N) const
    {
        T *dst = (T *)tile + to;
        if (row0 + ROWS <= N) { /* the whole tile lies before N (the same branch for every thread) */
            const T *at = src + (size_t)row0 * ROW_ELEMS + from;
#pragma unroll
            for (int k = 0; k < COPIES; k++) cp_async_16(dst + k * ROW_STEP * ROW_ELEMS, at + k * ROW_STEP * ROW_ELEMS);
        } else {
#pragma unroll
            for (int k = 0; k < COPIES; k++) {
                const bool valid = row0 + row + k * ROW_STEP < N;
                const size_t at = valid ? (size_t)row0 * ROW_ELEMS + from + k * ROW_STEP * ROW_ELEMS : 0;
                cp_async_16_zfill(dst + k * ROW_STEP * ROW_ELEMS, src + at, valid);
            }
        }
    }
};

/* ---- which lane points ldmatrix.x4 where ----
 *
 * ldmatrix.x4 reads four 8x8 matrices; lanes 8m .. 8m+7 give the addresses of the 8 rows of
 * matrix m, and register r[m] of every lane receives matrix m (layouts in mma.cuh). For a 16 x 16
 * block of a tile (16 rows, 2 chunks) there are two useful orders of the four matrices, so two
 * lane patterns, each giving a lane's row (0..15) and chunk (0 or 1) in the block:
 *
 *   A order: (rows 0-7, chunk 0), (rows 8-15, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 1)
 *     lane l -> row l mod 16, chunk l / 16
 *     plain:  the tile's rows are A's rows (Q in S = Q K^T): r = a[0..3] of the m16k16 A fragment.
 *     .trans: the tile's rows are B's k rows (V in P V): r[0], r[1] = b[0], b[1] of B's columns
 *             0-7, r[2], r[3] of columns 8-15.
 *   B order: (rows 0-7, chunk 0), (rows 0-7, chunk 1), (rows 8-15, chunk 0), (rows 8-15, chunk 1)
 *     lane l -> row (l mod 8) + 8 (l / 16), chunk (l / 8) mod 2
 *     plain:  the tile holds B^T, its rows are B's columns (K in S = Q K^T): r[0], r[1] =
 *             b[0], b[1] of B's columns 0-7 (tile rows 0-7), r[2], r[3] of columns 8-15.
 *     .trans: the tile holds A^T, its rows are A's k columns (dS^T read as dS): r = a[0..3]. */
static __device__ __forceinline__ int a_order_row(int lane) { return lane & 15; }
static __device__ __forceinline__ int a_order_chunk(int lane) { return lane >> 4; }
static __device__ __forceinline__ int b_order_row(int lane) { return (lane & 7) + ((lane >> 4) << 3); }
static __device__ __forceinline__ int b_order_chunk(int lane) { return (lane >> 3) & 1; }

/* ---- fragments from swizzled tiles, one call per fragment ----
 *
 * A 16 x 16 block of a swizzled tile of ROW_ELEMS-wide rows, starting at tile row r0 and logical
 * column c0 (a multiple of 8), into one fragment's four registers:
 *   frag_A:  A, the tile's rows are A's rows            (A order, plain)
 *   frag_Bt: B, the tile holds B^T (rows = B's columns)  (B order, plain)
 *   frag_B:  B, the tile's rows are B's k rows           (A order, .trans)
 *   frag_At: A, the tile holds A^T (rows = A's k columns) (B order, .trans) */
template <int ROW_ELEMS, typename E>
static __device__ __forceinline__ void frag_A(uint32_t f[4], const E *tile, int r0, int c0)
{
    const int lane = threadIdx.x % WARP_SIZE;
    ldmatrix_x4(f, tile + swizzle<ROW_ELEMS>(r0 + a_order_row(lane), c0 / 8 + a_order_chunk(lane)));
}
template <int ROW_ELEMS, typename E>
static __device__ __forceinline__ void frag_Bt(uint32_t f[4], const E *tile, int r0, int c0)
{
    const int lane = threadIdx.x % WARP_SIZE;
    ldmatrix_x4(f, tile + swizzle<ROW_ELEMS>(r0 + b_order_row(lane), c0 / 8 + b_order_chunk(lane)));
}
template <int ROW_ELEMS, typename E>
static __device__ __forceinline__ void frag_B(uint32_t f[4], const E *tile, int r0, int c0)
{
    const int lane = threadIdx.x % WARP_SIZE;
    ldmatrix_x4_trans(f, tile + swizzle<ROW_ELEMS>(r0 + a_order_row(lane), c0 / 8 + a_order_chunk(lane)));
}
template <int ROW_ELEMS, typename E>
static __device__ __forceinline__ void frag_At(uint32_t f[4], const E *tile, int r0, int c0)
{
    const int lane = threadIdx.x % WARP_SIZE;
    ldmatrix_x4_trans(f, tile + swizzle<ROW_ELEMS>(r0 + b_order_row(lane), c0 / 8 + b_order_chunk(lane)));
}

/* ---- fragments from swizzled tiles, the address computed once per lane ----
 *
 * A kernel at the 255-register limit cannot keep one address register per fragment. Instead a
 * lane computes its address once, at the first fragment of an operand (swizzle_addr, with a lane
 * pattern above), and every other fragment's address is that plus a compile-time step
 * (swizzle_step) of whole 8-row groups and an even number of chunks. Such a step keeps row mod 8,
 * so f(row) is unchanged, and the lane's own chunk is 0 or 1, so adding an even number of chunks
 * carries nothing into the swizzled chunk bits: the step is an XOR of constant bits plus a
 * constant, one or two integer instructions per ldmatrix (ldmatrix_x4_at in mma.cuh). */

/* The 32-bit shared-memory byte address of logical (row, chunk) in a swizzled tile at `tile` (a
 * 32-bit shared address, as __cvta_generic_to_shared gives). */
template <int ROW_ELEMS>
static __device__ __forceinline__ unsigned swizzle_addr(unsigned tile, int row, int chunk)
{
    return tile + 2 * swizzle<ROW_ELEMS>(row, chunk);
}

/* The address of the fragment `rows` rows (a multiple of 8) and `chunks` chunks (even) on from the
 * one at `lane_addr`. */
template <int ROW_ELEMS>
static __device__ __forceinline__ unsigned swizzle_step(unsigned lane_addr, int rows, int chunks)
{
    constexpr int LINE = ROW_ELEMS / 8 >= 8 ? 8 : ROW_ELEMS / 8; /* chunks the swizzle permutes together */
    return (lane_addr ^ ((chunks % LINE) << 4)) + rows * ROW_ELEMS * 2 + (chunks / LINE) * 16 * LINE;
}

#endif
