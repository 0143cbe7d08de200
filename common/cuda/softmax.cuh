/* softmax.cuh: the online softmax's row operations on a warp's tile of scores, and the epilogue
 * that divides O_i by l_i and writes L: what every Hopper forward (stages 11 to 14) does between
 * its matmuls and after its last one, and the decode stage (15) between its mma.sync, written once
 * so that a stage's diff shows its own idea.
 *
 * The layout. A warp holds M_TILES row tiles of 16 rows; S[mt][nt][c] is row 16 mt + 8 (c >> 1) + g
 * and column 8 nt + 2 t + (c & 1), with g = lane / 4 and t = lane % 4: mma.cuh's C fragment of an
 * m16n8 tile, which is also a warp's share of a wgmma accumulator (wgmma.cuh). So each row lives in
 * the four lanes of one quad (same g), two columns of every n8 tile per lane, and a lane holds two
 * rows per row tile (h = 0, 1: c = 2h, 2h + 1). m_i[mt][h], l_i[mt][h] and alpha[mt][h] are that
 * lane's rows' running max, its part of the running sum (its columns only: the quad's four parts
 * are added once, at the end), and the factor O_i's row is rescaled by. O[mt][dt][c] has the same
 * layout over the head dim's n8 tiles.
 *
 * Units: m_i is the max of the raw scores S = Q K^T (unscaled); the scale and log2(e) enter as one
 * factor, scale_log2 = scale * log2(e), inside the exponentials (exp2 on the MUFU units). */
#ifndef ATTN_CUDA_SOFTMAX_CUH
#define ATTN_CUDA_SOFTMAX_CUH

#include "common/cuda/counters.cuh"
#include "common/cuda/defs.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/wgmma.cuh"

#include <math.h>

/* Scores that must not count set to -inf: keys past N, and with a causal mask keys after the
 * query. query0: the warp's first query row (the tile's first row plus the warp's offset). A stage
 * calls it only on the tiles that need it (the tail tile, and the tiles that cross the diagonal). */
template <int M_TILES, int KT>
static __device__ __forceinline__ void mask_scores(float (&S)[M_TILES][KT][4], int key0, int query0, int N, int causal)
{
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int nt = 0; nt < KT; nt++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int key = key0 + nt * 8 + 2 * t + (c & 1);
                const int query = query0 + mt * 16 + 8 * (c >> 1) + g;
                if (key >= N || (causal && key > query)) S[mt][nt][c] = -INFINITY;
            }
}

/* One tile of the online softmax, row by row, in registers; S becomes P (fp32) in place:
 *   m_new = max(m_i, rowmax(S));  base = scale_log2 * m_new
 *   P     = exp2(scale_log2 * S - base)           one FFMA and one MUFU per score
 *   alpha = exp2(scale_log2 * m_i - base);  l_i = alpha l_i + rowsum(P);  m_i = m_new
 * O_i *= alpha is left to the caller (scale_rows), which may have to wait until the tensor cores
 * are done adding into O_i. A row masked so far has m_new = -inf: base = 0, so P = exp2(-inf) = 0
 * and alpha = 1, not NaN. The two products scale_log2 * m_i and scale_log2 * m_new are each
 * rounded once (__fmul_rn), alike, so that alpha is exactly 1 while the max stands: left to the
 * compiler, scale_log2 * m_i - base becomes one FFMA, whose result is base's rounding error instead
 * of 0 (up to 2^-10 where |base| ~ 2^14, inputs x100), and l_i, and L with it, would drift by that
 * factor on every tile after the max. */
template <int M_TILES, int KT>
static __device__ __forceinline__ void online_softmax(float (&S)[M_TILES][KT][4], float (&m_i)[M_TILES][2],
                                                      float (&l_i)[M_TILES][2], float (&alpha)[M_TILES][2],
                                                      float scale_log2)
{
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = m_i[mt][h];
#pragma unroll
            for (int nt = 0; nt < KT; nt++) mx = fmaxf(mx, fmaxf(S[mt][nt][2 * h], S[mt][nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1)); /* the quad holds the row */
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            const float base = mx == -INFINITY ? 0.f : __fmul_rn(mx, scale_log2);
            alpha[mt][h] = exp2_approx(__fmul_rn(m_i[mt][h], scale_log2) - base);
            m_i[mt][h] = mx;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < KT; nt++) {
                const float p0 = exp2_approx(fmaf(S[mt][nt][2 * h], scale_log2, -base));
                const float p1 = exp2_approx(fmaf(S[mt][nt][2 * h + 1], scale_log2, -base));
                S[mt][nt][2 * h] = p0, S[mt][nt][2 * h + 1] = p1;
                sum += p0 + p1;
            }
            l_i[mt][h] = alpha[mt][h] * l_i[mt][h] + sum;
        }
}

/* The same on a warp's one row tile held without the row-tile index (S[KT][4], m_i[2], ...) */
template <int KT>
static __device__ __forceinline__ void online_softmax(float (&S)[KT][4], float (&m_i)[2], float (&l_i)[2], float (&alpha)[2],
                                                      float scale_log2)
{
    typedef float rows[1][2];
    online_softmax(reinterpret_cast<float (&)[1][KT][4]>(S), reinterpret_cast<rows &>(m_i), reinterpret_cast<rows &>(l_i),
                   reinterpret_cast<rows &>(alpha), scale_log2);
}

/* --counters: one event of kind `counter` per row of this warp's that is a query (rows past N are
 * not), counted by the quad's first lane */
template <int M_TILES, class Tally>
static __device__ __forceinline__ void count_rows(Tally &tally, int counter, int query0, int N)
{
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (t == 0 && query0 + mt * 16 + 8 * h + g < N) tally.add(counter);
}

/* O_i *= alpha, row by row (DT: the head dim's n8 tiles) */
template <int M_TILES, int DT>
static __device__ __forceinline__ void scale_rows(float (&O)[M_TILES][DT][4], const float (&alpha)[M_TILES][2])
{
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int nt = 0; nt < DT; nt++) O[mt][nt][2 * h] *= alpha[mt][h], O[mt][nt][2 * h + 1] *= alpha[mt][h];
}

template <int DT>
static __device__ __forceinline__ void scale_rows(float (&O)[DT][4], const float (&alpha)[2])
{
    scale_rows(reinterpret_cast<float (&)[1][DT][4]>(O), reinterpret_cast<const float (&)[1][2]>(alpha));
}

/* The epilogue's arithmetic: l_i summed across the quad, O_i /= l_i in place, and the row's
 * L = scale * m + log(l) in nats (L points at the head's rows, query0 as in mask_scores; rows past N
 * are not written). An all-masked row (l = 0) gives O = 0. */
template <int M_TILES, int DT, class Tally>
static __device__ __forceinline__ void normalize_rows(float (&O)[M_TILES][DT][4], const float (&m_i)[M_TILES][2],
                                                      const float (&l_i)[M_TILES][2], float *L, int query0, int N,
                                                      float scale_log2, Tally &tally)
{
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = l_i[mt][h];
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            const float inv_l = sum > 0.f ? 1.f / sum : 0.f;
            const int query = query0 + mt * 16 + 8 * h + g;
            if (t == 0 && query < N) {
                tally.add(CNT_ROW_NORMALIZE);
                L[query] = m_i[mt][h] * scale_log2 * LN2 + logf(sum);
            }
#pragma unroll
            for (int nt = 0; nt < DT; nt++) O[mt][nt][2 * h] *= inv_l, O[mt][nt][2 * h + 1] *= inv_l;
        }
}

/* O's rows out through shared memory: the warp's rows (row0 .. row0 + 16 M_TILES - 1 of a tile of
 * Br rows, HeadDim wide, in the 128-byte swizzle; the stage passes its Q_i buffer, free once its
 * last S = Q K^T has been read) written as 16-bit pairs, then copied to global memory in 16-byte
 * stores along each row, rows past N left out. The caller makes sure no other warp still reads
 * these rows of the buffer. */
template <int Br, int HeadDim, int M_TILES, typename T>
static __device__ __forceinline__ void store_rows_sw128(const float (&O)[M_TILES][HeadDim / 8][4], T *tile, T *O_out,
                                                        int q0, int row0, int N)
{
    typedef mma16<T> M;
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = row0 + mt * 16 + 8 * h + g;
#pragma unroll
            for (int nt = 0; nt < HeadDim / 8; nt++)
                *(uint32_t *)&tile[sw128<Br>(r, nt) + 2 * t] = M::pack(O[mt][nt][2 * h], O[mt][nt][2 * h + 1]);
        }
    __syncwarp(); /* this warp's O rows in shared memory before its lanes copy them out */
    constexpr int CHUNKS = HeadDim / 8;
#pragma unroll 4 /* as nvcc unrolls it written in the kernel itself */
    for (int c = lane; c < 16 * M_TILES * CHUNKS; c += WARP_SIZE) {
        const int r = row0 + c / CHUNKS, chunk = c % CHUNKS, query = q0 + r;
        if (query < N)
            *(uint4 *)&O_out[(size_t)query * HeadDim + chunk * 8] = *(const uint4 *)&tile[sw128<Br>(r, chunk)];
    }
}

#endif
