/* 15_split_kv.cu: attention for generation, one query against a long KV cache (Flash-Decoding)
 *
 * Changed from stage 9: the shape. A decoder generating a token has N_q = 1 query per head (up to
 *   64: a few tokens of speculation or a short prompt) against N_kv keys of a cache that grows to
 *   100k and more, and its query heads share KV heads in groups (grouped-query attention: H / H_kv
 *   heads read one K and V; H_kv = 1 is multi-query). Stage 9 gives such a problem one block per
 *   (batch, head) that walks all N_kv keys alone: B * H blocks on an H200's 132 SMs, and each group
 *   of heads reads its K and V once per head. So:
 *   - the rows of one KV group: the G = H / H_kv query heads of a group are consecutive, so their
 *     G * N_q rows are one contiguous [G N_q, d] matrix of Q (and of O, and of L). A block takes
 *     16 of those rows, the M of one mma.sync m16n8k16 (padded when G N_q < 16): K and V are read
 *     once for the whole group, not once per head;
 *   - split-KV: the keys of each (batch, KV head) are cut into S slices, a block per slice: grid
 *     (B * H_kv * row tiles, S). Each block runs stage 9's online softmax over its slice alone and
 *     writes a partial O_s (fp32, normalized by its own l_s) and its logsumexp L_s to a workspace;
 *   - the merge, in the same kernel: O = sum_s exp(L_s - L) O_s with L = log sum_s exp(L_s), the
 *     online softmax's rescaling once more, across slices instead of tiles (merge_slices). The
 *     block of a row tile that finishes last does it: each block takes a ticket from a counter
 *     of its row tile once its partials are written, and the one that draws ticket S - 1 knows
 *     the other S - 1 are in memory (the "last block" pattern; no second kernel, no launch);
 *   - inside a block, the four warps split each K/V tile by keys (16 rows are one warp's worth of
 *     queries, so the warps cannot split rows as in stage 9) and merge the same way at the end;
 *   - S from the shape and the SM count (splits_for): one full wave, every block resident at once,
 *     then evened out so that no slice is a tile longer than it need be (at B = 1, H_kv = 8 on an
 *     H200: 32 slices from N_kv = 2k to 64k, 8 tiles each at 16k); --splits S overrides it;
 *   - three K/V tiles in flight (a cp.async ring, stage 9 has two): the kernel does little per
 *     byte, so what matters is how many bytes each SM has requested (a GPU that allows a block
 *     64 KiB, a T4, takes a ring of two: the configurations below);
 *   - causal means the queries are the last N_q of the N_kv positions: query i sees keys up to
 *     N_kv - N_q + i (bottom-right, as FlashAttention; keys_seen in common/attn.h).
 * Why: one query is a matrix-vector product per head. Each K and V element is used G N_q times
 *   (4 at a Llama-style shape: G = 4, N_q = 1), far below the ~200 FLOPs per byte where an H200
 *   stops being limited by HBM. The roofline is the bandwidth: time = bytes of K and V / HBM
 *   bandwidth, reachable only with every SM streaming.
 * Measured on H200: notes/15_split_kv.md (make bench-decode, bench/data/h200_decode.csv).
 * Run: ./stage15 --batch 1 --heads 32 --kv-heads 8 --seqlen 1 --kv-len 65536 --dim 128
 */
#include "common/attn.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/merge.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/softmax.cuh"
#include "common/cuda/swizzle.cuh"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* Query rows per block: one m16 tile of the mma, which holds a whole group at a Llama-style shape
 * (G = 4 heads, N_q = 1) and up to 16 rows of larger ones; more rows take more row tiles, each
 * reading the slice of K and V again (from L2 when they run together). */
constexpr int Br = 16;
/* Four warps, each taking a quarter of the keys of every K/V tile. */
constexpr int NWARPS = 4;
/* At most MAX_SPLITS slices (--splits allows no more): the merge keeps a weight per slice and row
 * in shared memory over the K/V ring, [max_splits][Br] floats (64 KiB at 1024). */
constexpr int MAX_SPLITS = 1024;
/* The merge's loads of partial rows O_s in flight per thread: they come from L2 at the kernel's very
 * end, with nothing to hide them, and at 32 slices 16 in flight are two round trips where 8 are four. */
constexpr int MERGE_UNROLL = 16;

/* The points of its work the kernel marks, for a probe: the stage's own (no_probe) does nothing
 * and costs nothing; bench/ablations/15_timeline.cu passes one that stamps the clock at each
 * (common/cuda/timeline.cuh), to see where a block's time goes. */
enum mark { AT_START, AT_FIRST_TILE, AT_LOOP_END, AT_PARTIALS, AT_TICKET, AT_MERGE_L, AT_MERGE_W, AT_END, MARKS };
struct no_probe {
    static constexpr bool on = false;
    static __device__ __forceinline__ void at(int) {}
};

/* The most slices, from MAX_SPLITS down by halves, whose merge (a weight per slice and row, then
 * each row's m and 1 / l) fits in ring_bytes of shared memory. */
constexpr int splits_fitting(size_t ring_bytes, int S)
{
    return 4 * ((size_t)S + 2) * Br <= ring_bytes || S == 1 ? S : splits_fitting(ring_bytes, S / 2);
}

/* One configuration: K/V tiles of Bc keys, STAGES of them in the cp.async ring (tile j computes
 * while the next STAGES - 1 copy), and everything derived from it; and the probe the kernel calls
 * at its marks. */
template <int HeadDim_, int Bc_, int STAGES_, class Probe_ = no_probe>
struct tiles {
    static constexpr int HeadDim = HeadDim_, Bc = Bc_, STAGES = STAGES_;
    typedef Probe_ Probe;
    static constexpr int NTHREADS = NWARPS * WARP_SIZE;
    static constexpr int KEYS_PER_WARP = Bc / NWARPS; /* 32 (d = 64) or 16 (d = 128) */
    static constexpr unsigned TILE_BYTES = 2 * Bc * HeadDim; /* one K (or V) tile, 16-bit */
    /* The loop's shared memory: the ring of K_j and of V_j, [STAGES][Bc][HeadDim] each. Q_i
     * [Br][HeadDim] is copied into the last K buffer, which the first tiles leave free: it goes to
     * registers before tile STAGES - 1 is copied there. */
    static constexpr size_t K_j = 0;
    static constexpr size_t V_j = K_j + (size_t)STAGES * TILE_BYTES;
    static constexpr size_t Q_i = K_j + (size_t)(STAGES - 1) * TILE_BYTES;
    static constexpr size_t loop_bytes = V_j + (size_t)STAGES * TILE_BYTES;
    /* After the loop, over the same memory: each warp's O [NWARPS][Br][O_STRIDE] fp32 (rows padded by
     * 8 floats, so that the 8 rows a warp's lanes write at once fall in different banks), then its
     * m (log2 units) and l per row [NWARPS][Br] each. */
    static constexpr int O_STRIDE = HeadDim + 8;
    static constexpr size_t merge_O = 0;
    static constexpr size_t merge_m = merge_O + 4 * (size_t)NWARPS * Br * O_STRIDE;
    static constexpr size_t merge_l = merge_m + 4 * (size_t)NWARPS * Br;
    static constexpr size_t merge_bytes = merge_l + 4 * (size_t)NWARPS * Br;
    /* The merge of the slices (the last block of a row tile), over the same memory once more: the
     * weight of each slice for each row [max_splits][Br], then each row's m and 1 / l [Br] each. As
     * many slices as the ring holds the weights of: MAX_SPLITS with three stages, half with two. */
    static constexpr int max_splits = splits_fitting(loop_bytes, MAX_SPLITS);
    static constexpr size_t slices_w = 0;
    static constexpr size_t slices_m = slices_w + 4 * (size_t)max_splits * Br;
    static constexpr size_t slices_inv_l = slices_m + 4 * (size_t)Br;
    static constexpr size_t slices_bytes = slices_inv_l + 4 * (size_t)Br;
    static constexpr size_t smem_bytes = std::max(loop_bytes, std::max(merge_bytes, slices_bytes));
    static_assert(slices_bytes <= loop_bytes, "the merge of the slices fits over the K/V ring");
    static_assert(Br == 16, "a block's rows are one m16 tile of the mma");
    static_assert(KEYS_PER_WARP % 16 == 0, "each warp's keys are whole k16 steps of P_ij V_j");
    static_assert(2 * Br * HeadDim <= TILE_BYTES && STAGES >= 2, "Q_i fits the K buffer it borrows");
};

/* Per head dim, fastest first (launch takes the first that fits the device's shared memory,
 * common/cuda/launch.cuh), Bc keys per K/V tile so that a tile of K and V is 32 KiB either way.
 * Three tiles in the ring make 96 KiB (Q_i borrows the last buffer until the loop starts): two
 * blocks share an SM on sm_90 (227 KiB), with four tiles (128 KiB) requested per SM at any time,
 * more than an SM's share of HBM's bytes in flight (Little's law: ~4.8 TB/s x ~1 us / 132 SMs ~ 35
 * KiB); and it fits the 99 KiB of consumer GPUs and the A100's 163. A T4 (64 KiB) takes a ring of
 * two: the same tiles and warps, one tile copying while one computes, 64 KiB; its merge takes at
 * most 512 slices (its splits rule asks for at most one per resident block, 40 on a T4). The tile
 * stays: a smaller Bc at d = 128 would leave each warp 8 keys, less than a k16 step of P_ij V_j. */
template <int HeadDim, class Probe>
struct cfg;
template <class Probe>
struct cfg<64, Probe> { typedef config_list<tiles<64, 128, 3, Probe>,    /* 96 KiB */
                                            tiles<64, 128, 2, Probe>> list; };  /* 64 KiB */
template <class Probe>
struct cfg<128, Probe> { typedef config_list<tiles<128, 64, 3, Probe>,   /* 96 KiB */
                                             tiles<128, 64, 2, Probe>> list; }; /* 64 KiB */

/* Calls f(Tiles{}) with the first configuration of head dim d that fits `limit` bytes. */
template <class Probe = no_probe, class F>
int with_tiles(int d, size_t limit, char *why, size_t n, F &&f)
{
    switch (d) {
    case 64: return first_fit(typename cfg<64, Probe>::list(), limit, d, why, n, f);
    case 128: return first_fit(typename cfg<128, Probe>::list(), limit, d, why, n, f);
    }
    snprintf(why, n, "supports head dim 64 or 128 (got d=%d)", d);
    return ATTN_UNSUPPORTED;
}

/* ---- kernel ---- */

/* The merge of the S slices of `rows` rows (row0 .. row0 + rows - 1 of O and L; rows <= Br), by
 * the block's NTHREADS threads, from the partials every slice's block wrote:
 *   m = max_s L_s,  w_s = exp(L_s - m)  ( = l_s exp(m_s - m), the share of slice s; 0 for -inf)
 *   O = sum_s w_s O_s / sum_s w_s,  L = m + log sum_s w_s   (lse_weight, lse_merged: merge.cuh)
 * The partials are read with __ldcg (ld.global.cg: from L2, never L1). The other blocks wrote them
 * through L2, and this SM's L1 may hold lines of the workspace from before (a block that ran here
 * earlier, or the previous call): an ordinary load could hit such a stale line. */
template <typename T, class Tiles>
__device__ __forceinline__ void merge_slices(const float *O_part, const float *L_part, T *O, float *L,
                                             size_t rows_all, size_t row0, int rows, int S, unsigned char *smem)
{
    constexpr int HeadDim = Tiles::HeadDim, NTHREADS = Tiles::NTHREADS, QUADS = HeadDim / 4;
    constexpr int PER_ROW = NTHREADS / Br; /* threads per row for the weights: 8 */
    static_assert(NTHREADS % Br == 0 && WARP_SIZE % PER_ROW == 0, "a row's threads within one warp");
    float *w = (float *)(smem + Tiles::slices_w); /* [S][Br]: L_s, then w_s */
    float *m_r = (float *)(smem + Tiles::slices_m), *inv_l_r = (float *)(smem + Tiles::slices_inv_l);
    const int tid = threadIdx.x;

    /* every L_s of the rows at once, [S][rows] in the workspace: a row tile's rows are adjacent */
    for (int c = tid; c < S * Br; c += NTHREADS) {
        const int s = c / Br, r = c % Br;
        w[c] = r < rows ? __ldcg(&L_part[(size_t)s * rows_all + row0 + r]) : -INFINITY;
    }
    __syncthreads(); /* every L_s in shared memory */
    Tiles::Probe::at(AT_MERGE_L);

    /* m and l per row, PER_ROW threads a row, each over every PER_ROW-th slice, then across them */
    {
        const int r = tid / PER_ROW, part = tid % PER_ROW;
        float m = -INFINITY;
        for (int s = part; s < S; s += PER_ROW) m = fmaxf(m, w[s * Br + r]);
#pragma unroll
        for (int off = PER_ROW / 2; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(FULL_MASK, m, off));
        float l = 0.f;
        for (int s = part; s < S; s += PER_ROW) { /* w_s = exp(L_s - m); a row of -inf only: all 0 */
            const float e = lse_weight(w[s * Br + r], m);
            w[s * Br + r] = e;
            l += e;
        }
#pragma unroll
        for (int off = PER_ROW / 2; off > 0; off /= 2) l += __shfl_xor_sync(FULL_MASK, l, off);
        if (part == 0) m_r[r] = m, inv_l_r[r] = l > 0.f ? 1.f / l : 0.f;
        if (part == 0 && r < rows) L[row0 + r] = lse_merged(m, l); /* nats */
    }
    __syncthreads(); /* every weight, m and 1 / l in shared memory */
    Tiles::Probe::at(AT_MERGE_W);

    /* O: a thread per four columns of a row, summing the slices' rows MERGE_UNROLL loads at a time */
    for (int c = tid; c < rows * QUADS; c += NTHREADS) {
        const int r = c / QUADS, col = (c % QUADS) * 4;
        const float *O_s = O_part + (row0 + r) * HeadDim + col; /* slice 0's; slice s is s rows_all rows on */
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll MERGE_UNROLL
        for (int s = 0; s < S; s++) {
            const float4 os = __ldcg((const float4 *)(O_s + (size_t)s * rows_all * HeadDim));
            const float ws = w[s * Br + r];
            o.x += ws * os.x, o.y += ws * os.y, o.z += ws * os.z, o.w += ws * os.w;
        }
        const float inv_l = inv_l_r[r];
        *(uint2 *)&O[(row0 + r) * HeadDim + col] =
            make_uint2(mma16<T>::pack(o.x * inv_l, o.y * inv_l), mma16<T>::pack(o.z * inv_l, o.w * inv_l));
    }
}

/* One block: rows r0 .. r0 + 15 of one (batch, KV head) group's G * N_q query rows, against the
 * keys of slice blockIdx.y of that KV head. With one slice (gridDim.y == 1) it writes O and L
 * itself; otherwise its partial O_s and L_s, and the last of the row tile's S blocks to finish
 * merges them (merge_slices). tickets: a counter per row tile (blockIdx.x), zero between calls. */
template <typename T, class Tiles>
__global__ void __launch_bounds__(Tiles::NTHREADS)
stage15_split_kernel(const T *__restrict__ Q, const T *__restrict__ K, const T *__restrict__ V, T *__restrict__ O,
                     float *__restrict__ L, float *__restrict__ O_part, float *__restrict__ L_part,
                     unsigned *__restrict__ tickets, int B, int H, int H_kv, int N_q, int N_kv, int causal,
                     float scale_log2, int row_tiles)
{
    typedef mma16<T> M;
    typedef typename Tiles::Probe Probe;
    Probe::at(AT_START);
    constexpr int HeadDim = Tiles::HeadDim, NTHREADS = Tiles::NTHREADS, Bc = Tiles::Bc, KW = Tiles::KEYS_PER_WARP;
    constexpr int STAGES = Tiles::STAGES;
    constexpr int KT = KW / 8;      /* key tiles: n8 tiles of S_ij in this warp's keys of a tile */
    constexpr int DT = HeadDim / 8; /* dim tiles: n8 column tiles of O_i */
    extern __shared__ __align__(128) unsigned char smem[];
    T *Q_i = (T *)(smem + Tiles::Q_i);
    T *K_ring = (T *)(smem + Tiles::K_j); /* [STAGES][Bc][HeadDim] */
    T *V_ring = (T *)(smem + Tiles::V_j);

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3; /* groupID, tid_in_group (see mma.cuh) */

    /* Which rows, which keys. x = (batch, KV head, row tile), y = the slice of the keys. */
    const int G = H / H_kv, M_rows = G * N_q; /* the group's query rows: G heads of N_q queries */
    const int rt = blockIdx.x % row_tiles, bhk = blockIdx.x / row_tiles;
    const int b = bhk / H_kv, hk = bhk % H_kv;
    const int r0 = rt * Br; /* this block's first row of the group's */
    /* the group's rows are contiguous in Q, O and L: heads hk G .. hk G + G - 1 of batch b */
    const size_t group_row0 = ((size_t)b * H + (size_t)hk * G) * N_q;
    Q += group_row0 * HeadDim;
    K += (size_t)bhk * N_kv * HeadDim;
    V += (size_t)bhk * N_kv * HeadDim;
    /* The slice: tiles [j_begin, j_end) of the Tc tiles of Bc keys, the slices within a tile of
     * each other in size (a slice may be empty when S > Tc: it then writes L_s = -inf, weight 0). */
    const int Tc = CEIL_DIV(N_kv, Bc), S = gridDim.y, s = blockIdx.y;
    const int j_begin = (int)((long long)s * Tc / S), j_end = (int)((long long)(s + 1) * Tc / S);

    /* This lane's two rows (mma C layout: g and g + 8 of the tile) and the last key each sees: all
     * N_kv, or causal, its query's position N_kv - N_q + i. A padding row (past the group's) sees
     * all keys; it is computed and never written. Tiles before the first key some row cannot see
     * need no mask at all. */
    int last_key[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = r0 + 8 * h + g;
        last_key[h] = causal && r < M_rows ? N_kv - N_q + r % N_q : N_kv - 1;
    }
    const int unmasked_below = causal ? N_kv - N_q : N_kv - 1; /* every row sees keys 0 .. this */

    /* This lane's ldmatrix addresses at the first fragment of each operand (the rest are
     * swizzle_steps from them): this warp's keys of K (stored as B^T) and of V (read .trans). */
    const unsigned K_lane = swizzle_addr<HeadDim>((unsigned)__cvta_generic_to_shared(K_ring),
                                                  warp * KW + b_order_row(lane), b_order_chunk(lane));
    const unsigned V_lane = swizzle_addr<HeadDim>((unsigned)__cvta_generic_to_shared(V_ring),
                                                  warp * KW + a_order_row(lane), a_order_chunk(lane));
    const swizzled_tile_loader<T, HeadDim, Bc, NTHREADS> kv_loader;

    /* Q_i, its own cp.async group (into the K buffer tile STAGES - 1 will take); then the first
     * STAGES - 1 tiles of the slice, a group each (committed even when empty, so that "tile j has
     * landed" is always the same wait). */
    load_tile_swizzled<T, HeadDim, Br, NTHREADS>(Q_i, Q, r0, M_rows); /* rows past the group: zeros */
    cp_async_commit();
#pragma unroll
    for (int p = 0; p < STAGES - 1; p++) {
        if (j_begin + p < j_end) {
            kv_loader.load(K_ring + p * Bc * HeadDim, K, (j_begin + p) * Bc, N_kv);
            kv_loader.load(V_ring + p * Bc * HeadDim, V, (j_begin + p) * Bc, N_kv);
        }
        cp_async_commit();
    }
    cp_async_wait<STAGES - 1>();
    __syncthreads(); /* Q_i in shared memory (the K/V tiles may still be on their way); its buffer is
                      * copied over only after the loop's first barrier, when every warp has it */
    /* Q_i stays in registers for the whole slice: A fragments, one per k16 step of the head dim */
    uint32_t Q_frag[HeadDim / 16][4];
#pragma unroll
    for (int k = 0; k < HeadDim / 16; k++) frag_A<HeadDim>(Q_frag[k], Q_i, 0, k * 16);

    /* m_i: running max of this warp's raw scores of each of the lane's two rows; l_i: the lane's part
     * of the row sum (added across the quad at the end); O_acc: the unnormalized O_i. */
    float O_acc[DT][4] = {};
    float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};

    for (int j = j_begin; j < j_end; j++) {
        const int step = j - j_begin;
        cp_async_wait<STAGES - 2>();
        __syncthreads(); /* tile j in shared memory for every warp; every warp is done with tile j-1,
                          * whose buffer the copy below takes */
        if (step == 0) Probe::at(AT_FIRST_TILE);
        if (j + STAGES - 1 < j_end) { /* tile j + STAGES - 1 copies while tile j computes */
            const int buf = (step + STAGES - 1) % STAGES;
            kv_loader.load(K_ring + buf * Bc * HeadDim, K, (j + STAGES - 1) * Bc, N_kv);
            kv_loader.load(V_ring + buf * Bc * HeadDim, V, (j + STAGES - 1) * Bc, N_kv);
        }
        cp_async_commit();
        const unsigned K_j = K_lane + (step % STAGES) * Tiles::TILE_BYTES;
        const unsigned V_j = V_lane + (step % STAGES) * Tiles::TILE_BYTES;
        const int key0 = j * Bc + warp * KW; /* this warp's first key of the tile */

        /* S_ij = Q_i K_j^T over this warp's KW keys (raw: the scale goes inside the exponential) */
        float S_ij[KT][4] = {};
#pragma unroll
        for (int k = 0; k < HeadDim / 16; k++)
#pragma unroll
            for (int kb = 0; kb < KW / 16; kb++) {
                uint32_t Kf[4]; /* B fragments: Kf[0..1] keys 16 kb .. +7, Kf[2..3] keys 16 kb + 8 .. +15 */
                ldmatrix_x4_at(Kf, swizzle_step<HeadDim>(K_j, kb * 16, 2 * k));
                M::mma(S_ij[2 * kb], Q_frag[k], &Kf[0]);
                M::mma(S_ij[2 * kb + 1], Q_frag[k], &Kf[2]);
            }

        /* Masks, on the last tile or two only: keys past N_kv (the tail) and, causal, keys after a
         * row's position. */
        if (j * Bc + Bc - 1 > unmasked_below) {
#pragma unroll
            for (int nt = 0; nt < KT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++)
                    if (key0 + nt * 8 + 2 * t + (c & 1) > last_key[c >> 1]) S_ij[nt][c] = -INFINITY;
        }

        /* The online softmax (common/cuda/softmax.cuh), as stage 9's: S_ij -> P_ij in place, m_i and
         * l_i updated; O_i *= alpha. A row that has seen only masked keys keeps m = -inf, P_ij = 0. */
        float alpha[2];
        online_softmax(S_ij, m_i, l_i, alpha, scale_log2);
        scale_rows(O_acc, alpha);

        /* O_i += P_ij V_j over this warp's keys, one k16 step at a time, P_ij packed from the C layout
         * of two n8 key tiles into one A fragment (mma.cuh) */
#pragma unroll
        for (int kb = 0; kb < KW / 16; kb++) {
            uint32_t P_ij[4];
            P_ij[0] = M::pack(S_ij[2 * kb][0], S_ij[2 * kb][1]);
            P_ij[1] = M::pack(S_ij[2 * kb][2], S_ij[2 * kb][3]);
            P_ij[2] = M::pack(S_ij[2 * kb + 1][0], S_ij[2 * kb + 1][1]);
            P_ij[3] = M::pack(S_ij[2 * kb + 1][2], S_ij[2 * kb + 1][3]);
#pragma unroll
            for (int n = 0; n < HeadDim; n += 16) {
                uint32_t Vf[4]; /* B fragments: Vf[0..1] columns n .. n+7, Vf[2..3] columns n+8 .. */
                ldmatrix_x4_trans_at(Vf, swizzle_step<HeadDim>(V_j, kb * 16, n / 8));
                M::mma(O_acc[n / 8], P_ij, &Vf[0]);
                M::mma(O_acc[n / 8 + 1], P_ij, &Vf[2]);
            }
        }
    }

    /* The four warps' results merged, the same rescaling as across tiles (and as merge_slices
     * across slices): with m = max_w m_w, l = sum_w exp2(m_w - m) l_w, O = sum_w exp2(m_w - m) O_w / l.
     * Through shared memory, over the K/V ring. */
    cp_async_wait<0>(); /* (only empty groups can be left) */
    __syncthreads();    /* every warp is done with the ring: the merge buffers overwrite it */
    Probe::at(AT_LOOP_END);
    float *O_w = (float *)(smem + Tiles::merge_O), *m_w = (float *)(smem + Tiles::merge_m);
    float *l_w = (float *)(smem + Tiles::merge_l);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float sum = l_i[h];
        sum += __shfl_xor_sync(FULL_MASK, sum, 1);
        sum += __shfl_xor_sync(FULL_MASK, sum, 2);
        const int r = 8 * h + g;
        if (t == 0) {
            m_w[warp * Br + r] = m_i[h] == -INFINITY ? -INFINITY : m_i[h] * scale_log2; /* log2 units */
            l_w[warp * Br + r] = sum;
        }
#pragma unroll
        for (int nt = 0; nt < DT; nt++)
            *(float2 *)&O_w[(warp * Br + r) * Tiles::O_STRIDE + nt * 8 + 2 * t] =
                make_float2(O_acc[nt][2 * h], O_acc[nt][2 * h + 1]);
    }
    __syncthreads(); /* every warp's O_w, m_w, l_w in shared memory */

    /* Each thread four columns of a row at a time: the merged row, then out in 16-byte (partial,
     * fp32) or 8-byte (O, 16-bit) stores along the row. */
    const bool final = S == 1;
    const size_t rows_all = (size_t)B * H * N_q; /* the rows of O and L, and of each slice's partials */
    constexpr int QUADS = HeadDim / 4;
    for (int c = tid; c < Br * QUADS; c += NTHREADS) {
        const int r = c / QUADS, col = (c % QUADS) * 4;
        if (r0 + r >= M_rows) continue; /* a padding row */
        float m = -INFINITY;
#pragma unroll
        for (int w = 0; w < NWARPS; w++) m = fmaxf(m, m_w[w * Br + r]);
        float l = 0.f, o[4] = {0.f, 0.f, 0.f, 0.f};
        if (m != -INFINITY) { /* else no key of this slice is visible to the row: O_s = 0, L_s = -inf */
#pragma unroll
            for (int w = 0; w < NWARPS; w++) {
                const float e = exp2_approx(m_w[w * Br + r] - m); /* 0 for a warp that saw no key */
                const float4 ow = *(const float4 *)&O_w[(w * Br + r) * Tiles::O_STRIDE + col];
                l += e * l_w[w * Br + r];
                o[0] += e * ow.x, o[1] += e * ow.y, o[2] += e * ow.z, o[3] += e * ow.w;
            }
        }
        const float inv_l = l > 0.f ? 1.f / l : 0.f;
        const float lse = m == -INFINITY ? -INFINITY : (m + log2f(l)) * LN2; /* nats, as L */
        const size_t row = group_row0 + r0 + r; /* the row's index in O and L, [B, H, N_q] */
        if (final) { /* one slice: this is the answer */
            *(uint2 *)&O[row * HeadDim + col] = make_uint2(M::pack(o[0] * inv_l, o[1] * inv_l),
                                                           M::pack(o[2] * inv_l, o[3] * inv_l));
            if (col == 0) L[row] = lse;
        } else { /* slice s of the row: [S][B H N_q][HeadDim] and [S][B H N_q] */
            *(float4 *)&O_part[((size_t)s * rows_all + row) * HeadDim + col] =
                make_float4(o[0] * inv_l, o[1] * inv_l, o[2] * inv_l, o[3] * inv_l);
            if (col == 0) L_part[(size_t)s * rows_all + row] = lse;
        }
    }
    if (final) {
        Probe::at(AT_PARTIALS), Probe::at(AT_END); /* (thread 0's part of O written; the others' may not be) */
        return;
    }

    /* The last block of the row tile merges. Why it may read the other slices' partials (the
     * "last block" pattern of the CUDA samples' threadFenceReduction, with every thread a writer):
     * - each thread's __threadfence() orders its partials before anything it does later, at the
     *   scope of the whole GPU; the barrier after it puts every thread's fence (and so every store
     *   of the block) before thread 0's atomicInc. A block that draws a ticket has its partials in
     *   memory where every SM can see them;
     * - the tickets are drawn by atomics on one counter, so they are S different numbers, 0 .. S-1,
     *   and the block that draws S - 1 is the last: the other S - 1 had drawn theirs, so had
     *   fenced their partials. Its own __threadfence() after the draw keeps its loads of them
     *   after it, and __ldcg reads them from L2, where the stores went (not a stale L1 line);
     * - atomicInc(p, S - 1) stores 0 when it reads S - 1: the last draw puts the counter back to
     *   zero, ready for the next call (stream order puts that call after this one's end).
     * The blocks never wait for one another: the first S - 1 leave, nothing is resident that
     * waits, and any number of slices works whatever fits on the GPU at once. */
    __threadfence();  /* this thread's partials visible to the whole GPU before the ticket */
    __syncthreads();  /* every thread's stores and fence done; the merge below reuses the smem too */
    Probe::at(AT_PARTIALS);
    bool last = false;
    if (tid == 0) {
        last = atomicInc(&tickets[blockIdx.x], S - 1) == (unsigned)(S - 1);
        if (last) __threadfence(); /* the other blocks' partials read after the ticket that says
                                    * they are written */
    }
    if (!__syncthreads_or(last)) { /* (a barrier: thread 0's ticket for the whole block) */
        Probe::at(AT_END);
        return;
    }
    Probe::at(AT_TICKET);
    merge_slices<T, Tiles>(O_part, L_part, O, L, rows_all, group_row0 + r0, min(Br, M_rows - r0), S, smem);
    if constexpr (Probe::on) {
        __syncthreads(); /* every thread's part of the merge issued */
        Probe::at(AT_END);
    }
}

/* ---- launcher ---- */

int row_tiles_of(const struct shape *sh) { return CEIL_DIV(sh->H / shape_kv_heads(sh) * sh->N, Br); }

/* Blocks of the split kernel one SM holds (its shared memory decides: 2 on sm_90, 1 on sm_80),
 * times the SMs: how many run at once. Asked of the device once per configuration. */
template <class Tiles>
int resident_blocks(char *why, size_t n)
{
    static int cached = 0;
    if (cached) return cached;
    constexpr int HeadDim = Tiles::HeadDim;
    if (smem_optin(stage15_split_kernel<__nv_bfloat16, Tiles>, Tiles::smem_bytes, HeadDim, why, n)) return -1;
    /* all of the SM's unified L1/shared memory as shared memory (the loads bypass L1: cp.async.cg),
     * so that two blocks fit wherever the device has room for them, rather than where the driver's
     * default split happens to leave it; then the count, which the carveout decides */
    if (cudaFuncSetAttribute(stage15_split_kernel<__half, Tiles>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared) != cudaSuccess ||
        cudaFuncSetAttribute(stage15_split_kernel<__nv_bfloat16, Tiles>,
                             cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared) != cudaSuccess) {
        snprintf(why, n, "cannot set the kernel's shared-memory carveout: %s",
                 cudaGetErrorString(cudaGetLastError()));
        return -1;
    }
    const int r = resident_blocks_of(stage15_split_kernel<__half, Tiles>, Tiles::NTHREADS, Tiles::smem_bytes, HeadDim,
                                     why, n);
    if (r > 0) cached = r;
    return r;
}

/* The number of slices S (the rule, written down): --splits where given; else one full wave,
 *   S_wave = max(1, floor(resident blocks / (B * H_kv * row tiles))),
 * so that every block of the grid is resident at once and each SM streams its share of K and V
 * from the first microsecond to the last (two waves would leave a tail of half-empty SMs; a
 * problem with more groups than resident blocks fills the GPU without splitting); then evened out:
 *   per = ceil(Tc / S_wave) tiles a slice,  S = ceil(Tc / per),
 * the fewest slices whose longest is no longer than S_wave slices' longest (the time is the longest
 * slice's; a slice more only adds to the merge): at Tc = 256 tiles and S_wave = 33, 32 slices of 8
 * tiles rather than 33 of 7 or 8. S <= Tc (a slice of at least one tile), and no more than the
 * configuration's merge takes (max_splits: at most 512, more than any GPU holds blocks of it). */
template <class Tiles>
int splits_for(const struct shape *sh, char *why, size_t n)
{
    if (sh->splits > 0) return sh->splits;
    const int slots = resident_blocks<Tiles>(why, n);
    if (slots < 0) return -1;
    const long long groups = (long long)sh->B * shape_kv_heads(sh) * row_tiles_of(sh);
    const long long Tc = CEIL_DIV(shape_kv_len(sh), Tiles::Bc);
    const long long S_wave = std::min((long long)Tiles::max_splits, std::max(1LL, slots / groups));
    const long long per = CEIL_DIV(Tc, S_wave);
    return (int)CEIL_DIV(Tc, per);
}

/* For the harness's report (the descriptor's kv_splits): the S a run of this shape uses, with the
 * tiles this device takes. */
int kv_splits(const struct shape *sh)
{
    char why[256];
    const int S = with_tiles(sh->d, gpu_smem_limit(), why, sizeof why,
                             [&](auto tl) { return splits_for<decltype(tl)>(sh, why, sizeof why); });
    return S > 0 ? S : 1;
}

/* The workspace: with S > 1, each slice's O_s (fp32) and L_s for every row, then the merge's ticket
 * counter of every row tile, which must be zero when it is allocated (the harness zeroes a
 * workspace once); every call leaves them at zero again. */
size_t workspace_bytes(const struct attn_args *a)
{
    const struct shape *sh = &a->sh;
    const int S = kv_splits(sh);
    const size_t row_tile_count = (size_t)sh->B * shape_kv_heads(sh) * row_tiles_of(sh);
    return S > 1 ? (size_t)S * shape_rows(sh) * (sh->d + 1) * sizeof(float) + row_tile_count * sizeof(unsigned) : 0;
}

/* --splits beyond what the configuration's merge holds the weights of (max_splits): ATTN_UNSUPPORTED,
 * one line. */
template <class Tiles>
int splits_refused(int S, char *why, size_t n)
{
    if (S <= Tiles::max_splits) return 0;
    snprintf(why, n, "at most %d slices of the keys with this device's tiles (Bc=%d, %d K/V stages; got --splits %d)",
             Tiles::max_splits, Tiles::Bc, Tiles::STAGES, S);
    return ATTN_UNSUPPORTED;
}

template <typename T, class Tiles>
int launch(const struct attn_args *a, char *why, size_t n)
{
    constexpr int HeadDim = Tiles::HeadDim;
    const struct shape *sh = &a->sh;
    if (int rc = smem_optin(stage15_split_kernel<T, Tiles>, Tiles::smem_bytes, HeadDim, why, n)) return rc;
    if (resident_blocks<Tiles>(why, n) < 0) return ATTN_CUDA_ERROR; /* (once: sets the carveout too) */
    const int S = splits_for<Tiles>(sh, why, n);
    if (S < 0) return ATTN_CUDA_ERROR;
    if (int rc = splits_refused<Tiles>(S, why, n)) return rc;
    const int row_tiles = row_tiles_of(sh);
    const long long blocks = (long long)sh->B * shape_kv_heads(sh) * row_tiles;
    if (blocks > 2147483647LL) {
        snprintf(why, n, "batch * KV heads * row tiles = %lld is more than a grid dimension holds (2^31 - 1)", blocks);
        return ATTN_UNSUPPORTED;
    }
    float *O_part = NULL, *L_part = NULL;
    unsigned *tickets = NULL;
    const size_t rows = shape_rows(sh);
    if (S > 1) { /* the workspace: [S][rows][HeadDim] partial O, [S][rows] partial L, [blocks] tickets */
        if (!a->work) {
            snprintf(why, n, "%d slices need a workspace (workspace_bytes) and none was given", S);
            return ATTN_UNSUPPORTED;
        }
        O_part = (float *)a->work;
        L_part = O_part + (size_t)S * rows * HeadDim;
        tickets = (unsigned *)(L_part + (size_t)S * rows);
    }
    const float scale_log2 = sh->scale * LOG2E;
    /* (batch, KV head, row tile) in x, the slice in y (S <= 1024, under y's 65535) */
    stage15_split_kernel<T, Tiles><<<dim3((unsigned)blocks, (unsigned)S), Tiles::NTHREADS, Tiles::smem_bytes>>>(
        (const T *)a->Q, (const T *)a->K, (const T *)a->V, (T *)a->O, a->L, O_part, L_part, tickets, sh->B, sh->H,
        shape_kv_heads(sh), sh->N, shape_kv_len(sh), sh->causal, scale_log2, row_tiles);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* dtype and head dim (its tiles: the first that fits this device) -> the kernel's template arguments */
template <typename T>
int dispatch_d(const struct attn_args *a, char *why, size_t n)
{
    return with_tiles(a->sh.d, gpu_smem_limit(), why, n, [&](auto tl) { return launch<T, decltype(tl)>(a, why, n); });
}

int forward(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype == DT_F16) return dispatch_d<__half>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch_d<__nv_bfloat16>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

/* The tiles forward takes where a block may have `limit` bytes (the summary names them); a
 * --splits their merge cannot take is refused here too, before anything runs. */
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    (void)backward; /* a forward only */
    return with_tiles(a->sh.d, limit, c->text, sizeof c->text, [&](auto tl) {
        typedef decltype(tl) Tl;
        if (int rc = splits_refused<Tl>(a->sh.splits, c->text, sizeof c->text)) return rc;
        return tiles_found(c, Br, Tl::Bc, Tl::smem_bytes, "Br=%d Bc=%d, %d K/V stages", Br, Tl::Bc, Tl::STAGES);
    });
}

} // namespace

extern "C" const struct stage stage15_desc = {
    .name = "stage15",
    .idea = "generation: N_q <= 64 queries against a long KV cache, split across blocks and merged by LSE "
            "(Flash-Decoding); grouped KV heads",
    .device = ON_GPU,
    .forward = forward,
    .backward = NULL,
    .dims = {64, 128},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = workspace_bytes,
    .openmp = 0,
    .hbm_traffic = NULL,
    .measures_backward = 0,
    .arch_sm = 0,
    .kv_cache = 1,
    .max_seqlen = 64,
    .kv_splits = kv_splits,
    .tiles = tiles_for,
};
