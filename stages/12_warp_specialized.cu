/* 12_warp_specialized.cu: FlashAttention-2 forward on Hopper, its loads moved to a producer warp
 *   and the copy engine (TMA), its math on consumer warpgroups: FlashAttention-3's structure
 *
 * Changed from stage 11: the math stays (S_ij = Q_i K_j^T and O_i += P_ij V_j on wgmma, each
 *   consumer warpgroup owning 64 rows of the Q tile, the online softmax between them, P_ij in
 *   registers; the grid heaviest first, causal tiles skipped); who loads, and how, is new (helpers
 *   in common/cuda/tma.cuh):
 *   - a producer warpgroup, after the consumers: one of its threads issues every copy as a TMA bulk
 *     tensor copy, Q_i once, then K_j and V_j for j = 0, 1, ... into a ring of STAGES shared-memory
 *     stages; the copy engine writes the 128-byte swizzle wgmma reads, and zero-fills rows past N;
 *   - each ring stage has two mbarriers: full (the producer announces the bytes, the copy engine
 *     completes the phase when they have landed) and empty (every consumer warp arrives once its
 *     wgmma have read the stage). Consumers wait on full, the producer on empty: the loop has no
 *     block barrier, and the consumer warpgroups no longer move in lockstep;
 *   - setmaxnreg: the producer warpgroup drops to 24 registers per thread and the consumers take
 *     what it gives back;
 *   - with those registers, three consumer warpgroups at d = 64 and 128 (Br = 192 rows): each K/V
 *     tile copied, and each wait on it, serves 192 query rows instead of 128;
 *   - the tensor maps are [B*H][N][d]: a tile's rows past N are out of bounds and arrive as zeros
 *     (keys past N are still masked: a zero key scores 0, not -inf);
 *   - tiles and ring per head dim (configuration below): Bc = 128 at d = 64 (stage 11: 64), and
 *     O_i += P_ij V_j left running under the next S = Q K^T at d = 64 only.
 * Why: in stage 11 every thread issues its share of cp.async between the two matmuls, waits for
 *   its own copies and meets every other warp at a block barrier, once per tile: the loads cost
 *   issue slots and registers, and the slower warpgroup holds up the faster. Here the copies cost
 *   the consumers nothing but a wait that is normally already satisfied, and one warpgroup's
 *   softmax can run while another's wgmma keep the tensor cores busy.
 * Hopper only: compiled for sm_90a (the Makefile's HOPPER_STAGES); elsewhere it exits 3.
 * Measured on H200: notes/12_warp_specialized.md; bench/ablations/12_two_warpgroups.cu builds this
 *   kernel with two consumer warpgroups at every head dim, to time the third against.
 * Run: ./stage12 --batch 1 --heads 1 --seqlen 16384 --dim 128 --causal
 */
#include "common/attn.h"
#include "common/cuda/counters.cuh"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/softmax.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"

#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* A configuration is a type with five constants (cfg<HeadDim> below is the stage's, one per head
 * dim; the kernel and launcher take any, so that an ablation can pass its own):
 *   HeadDim      d;
 *   NWARPGROUPS  consumer warpgroups, 64 rows of the Q tile each (the M of one wgmma), all reading
 *                the same K_j, V_j: Br = 64 NWARPGROUPS;
 *   Bc           keys per K/V tile (the N of the wgmma for S_ij);
 *   STAGES       ring stages, each a K_j and a V_j buffer;
 *   TURNED       1: O_i += P_ij V_j is left running while the consumer waits for tile j+1 and
 *                issues S = Q K_{j+1}^T (stage 11's loop), so a consumer holds two stages (V_j
 *                still being read, and tile j+1) and frees tile j's only at the wait for
 *                S_{i,j+1}: the copy engine fills STAGES - 2 ahead. 0: P_ij V_j is waited for at
 *                once and tile j's stage freed then: STAGES - 1 ahead.
 * Per thread a consumer warpgroup's accumulators hold Bc / 2 fp32 of S_ij and HeadDim / 2 of O_i,
 * and P_ij takes Bc / 4 registers (16-bit pairs) that the tensor cores read until the wait: all
 * three live at once.
 *
 * The producer warpgroup comes after the consumers, so that the consumers' thread, warp and
 * warpgroup numbers are stage 11's. One of its threads issues every copy; the copies need no
 * registers for their data, so the warpgroup gives its registers away. __launch_bounds__(NTHREADS,
 * 1) gives every thread 65536 / NTHREADS at launch (a multiple of 8); setmaxnreg.dec takes the
 * producer to 24 and setmaxnreg.inc gives the consumers what that frees:
 *   three consumer warpgroups, 512 threads: 128 at launch; 24 x 128 + 160 x 384 = 64512 <= 65536
 *   two consumer warpgroups,   384 threads: 168 at launch; 24 x 128 + 240 x 256 = 64512 = 168 x 384
 * One block per SM (the registers), so the shared memory beside Q_i goes to the ring (a block may
 * have 227 KiB; the mbarriers add 16 bytes per stage and 8 for Q_i):
 *
 *   d     consumer WGs  Br   Bc   STAGES  TURNED  consumer registers          Q_i + ring
 *   64    3             192  128  4       1       160: O 32 + S 64 + P 32     24 + 4 x 32 = 152 KiB
 *   128   3             192  128  2       0       160: O 64 + S 64 + P 32     48 + 2 x 64 = 176 KiB
 *   256   2             128   64  2       0       240: O 128 + S 32 + P 16    64 + 2 x 64 = 192 KiB
 *
 * d = 64:  the third warpgroup fits in 160 registers. Bc = 128, not stage 11's 64 (faster there,
 *          between block barriers every tile; here there are none): a tile of 64 keys has the same
 *          waits and softmax bookkeeping for half the work. Turned: of the four stages the
 *          consumers hold two and the copy engine fills two.
 * d = 128: at 160 registers ptxas spills 24 bytes (three 8-byte values stored once, reloaded
 *          every tile), and beside a Q_i of 192 rows only two stages fit: not turned, so that the
 *          copy engine fills one stage while the consumers read the other.
 * d = 256: O_i alone is 128 registers: two warpgroups. Two stages (three do not fit), not turned,
 *          so that tile j's stage is freed as soon as P_ij V_j is done and tile j+2 has the whole
 *          of tile j+1's work to land in (turned, it would have only tile j+1's softmax).
 * What each choice and its alternatives measured: notes/12_warp_specialized.md. */
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { static constexpr int HeadDim = 64, NWARPGROUPS = 3, Bc = 128, STAGES = 4, TURNED = 1; };
template <>
struct cfg<128> { static constexpr int HeadDim = 128, NWARPGROUPS = 3, Bc = 128, STAGES = 2, TURNED = 0; };
template <>
struct cfg<256> { static constexpr int HeadDim = 256, NWARPGROUPS = 2, Bc = 64, STAGES = 2, TURNED = 0; };
constexpr int WARPGROUP = 4 * WARP_SIZE; /* threads that issue one wgmma together */
constexpr int PRODUCER_REGS = 24; /* setmaxnreg, per thread (above); the consumers' share: tiles */
constexpr size_t SMEM_MAX = 227 * 1024; /* the shared memory a block may have on an H100 or H200 */

/* Everything derived from a configuration: tile sizes, threads, registers, the shared-memory layout. */
template <typename Cfg>
struct tiles {
    static constexpr int HeadDim = Cfg::HeadDim, Bc = Cfg::Bc, STAGES = Cfg::STAGES;
    static constexpr bool TURNED = Cfg::TURNED != 0;
    static constexpr int NWARPGROUPS = Cfg::NWARPGROUPS; /* consumer warpgroups */
    static constexpr int NWARPS = 4 * NWARPGROUPS;       /* consumer warps */
    /* the wgmma accumulators give each warp 16 rows of its warpgroup's 64: one m16 row tile */
    static constexpr int M_TILES = 1;
    static constexpr int NTHREADS = NWARPS * WARP_SIZE + WARPGROUP; /* the consumers, then the producer */
    /* setmaxnreg (above): the registers each thread has at launch, and the consumers' share of what
     * the producer gives back: 240 with two consumer warpgroups, 160 with three */
    static constexpr int LAUNCH_REGS = 65536 / NTHREADS / 8 * 8;
    static constexpr int CONSUMER_REGS = (LAUNCH_REGS * NTHREADS - PRODUCER_REGS * WARPGROUP) / (NWARPS * WARP_SIZE) / 8 * 8;
    static constexpr int ROWS_PER_WARP = 16 * M_TILES;
    static constexpr int Br = NWARPS * ROWS_PER_WARP;
    /* Q_i [Br][HeadDim], then the ring: STAGES buffers of K_j [Bc][HeadDim], STAGES of V_j, all
     * 16-bit, in the 128-byte swizzle (wgmma.cuh): each starts on a 1024-byte atom. Then the
     * mbarriers, 8 bytes each: full[STAGES], empty[STAGES], Q_full. */
    static constexpr size_t Q_i = 0;
    static constexpr size_t K_j = Q_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t V_j = K_j + STAGES * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t full = V_j + STAGES * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t empty = full + STAGES * sizeof(uint64_t);
    static constexpr size_t Q_full = empty + STAGES * sizeof(uint64_t);
    static constexpr size_t bytes = Q_full + sizeof(uint64_t);
    static_assert(Br == NWARPGROUPS * 64, "a warpgroup's rows are one wgmma's M, 64");
    static_assert(HeadDim % 64 == 0, "the 128-byte swizzle takes rows of whole 64-element blocks");
    static_assert(Bc % 16 == 0 && Bc >= 64, "Bc: one wgmma's N, and whole k16 steps of P_ij V_j");
    static_assert(K_j % SW128_ATOM_BYTES == 0 && V_j % SW128_ATOM_BYTES == 0 && 2 * Bc * HeadDim % SW128_ATOM_BYTES == 0,
                  "every tile on a 1024-byte atom");
    static_assert(Br <= 256 && Bc <= 256, "a TMA box has at most 256 rows");
    static_assert(STAGES >= 2, "a ring: the copy engine fills one stage while the consumers read another");
    static_assert(bytes <= SMEM_MAX, "Q_i and the ring fit the shared memory of one block");
    static_assert(PRODUCER_REGS * WARPGROUP + CONSUMER_REGS * NWARPS * WARP_SIZE <= LAUNCH_REGS * NTHREADS,
                  "the consumers take no more registers than the producer gives back");
    static_assert(CONSUMER_REGS <= 256, "setmaxnreg: at most 256 registers per thread");
};

/* ---- kernel ---- */

/* Cfg: a configuration (above). COUNT: the counting build for --counters (common/cuda/counters.cuh);
 * the timed build has none. */
template <typename T, typename Cfg, bool COUNT>
__global__ void __launch_bounds__(tiles<Cfg>::NTHREADS, 1)
stage12_warp_specialized_kernel(const __grid_constant__ CUtensorMap tmap_Q, const __grid_constant__ CUtensorMap tmap_K,
                                const __grid_constant__ CUtensorMap tmap_V, T *__restrict__ O, float *__restrict__ L,
                                int N, int causal, float scale_log2, unsigned long long *counters)
{
    typedef tiles<Cfg> Tiles;
    typedef mma16<T> M;
    constexpr int HeadDim = Tiles::HeadDim;
    constexpr int M_TILES = Tiles::M_TILES, Br = Tiles::Br, Bc = Tiles::Bc, STAGES = Tiles::STAGES;
    constexpr bool TURNED = Tiles::TURNED;
    constexpr int NWARPGROUPS = Tiles::NWARPGROUPS, NWARPS = Tiles::NWARPS;
    constexpr int KT = Bc / 8;      /* key tiles: n8 tiles of S_ij */
    constexpr int DT = HeadDim / 8; /* dim tiles: n8 column tiles of O_i */
    extern __shared__ __align__(SW128_ATOM_BYTES) unsigned char smem[];
    T *Q_i = (T *)(smem + Tiles::Q_i);
    T *K_buf = (T *)(smem + Tiles::K_j); /* [STAGES][Bc][HeadDim] */
    T *V_buf = (T *)(smem + Tiles::V_j); /* [STAGES][Bc][HeadDim] */
    uint64_t *full = (uint64_t *)(smem + Tiles::full);   /* [STAGES]: stage s's K_j, V_j have landed */
    uint64_t *empty = (uint64_t *)(smem + Tiles::empty); /* [STAGES]: every consumer warp is done with it */
    uint64_t *Q_full = (uint64_t *)(smem + Tiles::Q_full); /* Q_i has landed */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int wg = tid / WARPGROUP;             /* this thread's warpgroup: rows 64 wg .. 64 wg + 63;
                                                 * NWARPGROUPS: the producer */
    const int row0 = warp * Tiles::ROWS_PER_WARP;  /* this warp's rows of Q_i, O_i (warp w of warpgroup
                                                    * wg owns rows 64 wg + 16 w .. + 15) */
    /* the matrix descriptors (wgmma.cuh), each at its operand's first k16 step; the others are
     * compile-time steps from them: Q_i and K_j K-major (rows contiguous along d), V_j MN-major
     * (its rows are the keys, P_ij V_j's k), its 64-column blocks Bc rows of 128 bytes apart */
    const uint64_t Q_desc = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(Q_i) + wg * 64 * SW128_ROW_BYTES);
    const uint64_t K_desc = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(K_buf));
    const uint64_t V_desc = wgmma_desc_mnmajor((unsigned)__cvta_generic_to_shared(V_buf), Bc * SW128_ROW_BYTES);
    constexpr unsigned TILE_BYTES = 2 * Bc * HeadDim; /* one K (or V) buffer */

    /* The grid: x = (batch, head), y = Q tile. Blocks start in linear order (x fastest), so with a
     * causal mask y = 0 takes the last Q tile, which sees the most K/V tiles: the longest blocks
     * start first and the short ones fill in at the end. */
    const int Tr = gridDim.y;
    const int i = causal ? Tr - 1 - (int)blockIdx.y : (int)blockIdx.y;
    const int bh = blockIdx.x; /* the head: the tensor maps' outermost coordinate */
    O += (size_t)bh * N * HeadDim, L += (size_t)bh * N;
    const int q0 = i * Br; /* first query row of this tile */
    /* K/V tiles this Q tile sees: all of them, or (causal) up to the one holding its last row */
    const int Tc = CEIL_DIV(N, Bc);
    const int n_tiles = causal ? min(Tc, (min(q0 + Br, N) - 1) / Bc + 1) : Tc;
    work_tally<COUNT> tally;

    /* The barriers, by one thread: full[s] completes a phase when the producer has arrived (1) and
     * the bytes it announced have landed; empty[s] when each of the NWARPS consumer warps has
     * arrived once (one lane per warp, after the warp's wait for its wgmma). */
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], NWARPS);
        mbar_init(Q_full, 1);
        mbar_fence_init(); /* visible to the copy engine, which completes them */
    }
    __syncthreads(); /* the barriers initialized before any thread waits on them or issues a copy;
                      * the last barrier of the whole block (the producer's idle warps leave) */

    if (wg == NWARPGROUPS) {
        /* ---- the producer: one thread issues every copy, the rest of the warpgroup leaves ---- */
        setmaxnreg_dec<PRODUCER_REGS>(); /* the whole warpgroup, together: its registers to the pool */
        if (tid == NWARPS * WARP_SIZE) {
            tma_prefetch_map(&tmap_Q), tma_prefetch_map(&tmap_K), tma_prefetch_map(&tmap_V);
            /* Q_i: HeadDim / 64 boxes of 64 columns x Br rows, one per column block */
            mbar_arrive_expect_tx(Q_full, 2 * Br * HeadDim);
            for (int cb = 0; cb < HeadDim / 64; cb++)
                tma_load_3d(Q_i + cb * Br * 64, &tmap_Q, Q_full, cb * 64, q0, bh);
            /* K_j, V_j into stage j % STAGES, the (j / STAGES)-th time round the ring. From the
             * second round on the stage must first be empty: its previous tile, j - STAGES, read by
             * every consumer warp, the phase (j / STAGES - 1) of empty[s]. */
            for (int j = 0; j < n_tiles; j++) {
                const int s = j % STAGES, round = j / STAGES;
                if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                mbar_arrive_expect_tx(&full[s], 2 * TILE_BYTES); /* K_j and V_j: the phase ends when both land */
                for (int cb = 0; cb < HeadDim / 64; cb++) {
                    tma_load_3d(K_buf + s * Bc * HeadDim + cb * Bc * 64, &tmap_K, &full[s], cb * 64, j * Bc, bh);
                    tma_load_3d(V_buf + s * Bc * HeadDim + cb * Bc * 64, &tmap_V, &full[s], cb * 64, j * Bc, bh);
                }
            }
        }
        return; /* the copies in flight finish on their own; the consumers wait for them */
    }

    /* ---- the consumers: stage 11's loop, without a load or a block barrier ---- */
    setmaxnreg_inc<Tiles::CONSUMER_REGS>(); /* every consumer warpgroup, each together: the producer's registers */

    /* This lane's rows are row0 + 16 mt + 8 h + g (mt < M_TILES, h = 0, 1). m_i is the running
     * max of the raw scores (not yet scaled); l_i is this lane's part of the row sum (its 2 of
     * every 8 columns), added across the quad only at the end. P_ij is the A operand of
     * O_i += P_ij V_j, packed to 16 bits. */
    float O_acc[M_TILES][DT][4] = {};
    float m_i[M_TILES][2], l_i[M_TILES][2];
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++) m_i[mt][0] = m_i[mt][1] = -INFINITY, l_i[mt][0] = l_i[mt][1] = 0.f;
    uint32_t P_ij[Bc / 16][4];

    /* Tile j's K_j, V_j have landed in ring stage j mod STAGES: the (j / STAGES)-th phase of its
     * full barrier. The copy engine wrote them through the async proxy, the proxy wgmma reads
     * through: no fence, and no block barrier. */
    auto next_tile = [&](int j) { mbar_wait(&full[j % STAGES], (j / STAGES) & 1); };
    /* This warp is done with tile j's ring stage: it has waited for every wgmma that read K_j and
     * V_j. One arrival per warp: the last of the NWARPS frees the stage for tile j + STAGES. */
    auto release = [&](int j) {
        if (lane == 0) mbar_arrive(&empty[j % STAGES]);
    };

    /* S_ij = Q_i K_j^T, masked, through the online softmax into P_ij; O_i rescaled. */
    auto scores = [&](int j) {
        const uint64_t K_j = wgmma_desc_step(K_desc, (j % STAGES) * TILE_BYTES);
        const int key0 = j * Bc; /* first key of this tile */
        /* S_ij = Q_i K_j^T (raw: the scale is applied inside the exponential), this warpgroup's
         * 64 rows: one m64nBck16 wgmma per k16 step of the head dim, the first one overwriting
         * S_ij (accumulate = 0), all in one group. S_ij[0] and O_acc[0]: a warp's one row tile.
         * With the loop turned O_i += P_{i,j-1} V_{j-1} is still running: the tensor cores take
         * this group right after it, and the wait covers both. */
        float S_ij[M_TILES][KT][4];
        wgmma_fence(); /* S_ij's registers were last written by ordinary instructions (tile j-1) */
#pragma unroll
        for (int k = 0; k < HeadDim / 16; k++)
            wgmma_ss<T, Bc, 0>(S_ij[0], wgmma_desc_step(Q_desc, sw128_kmajor_step<Br>(k)),
                               wgmma_desc_step(K_j, sw128_kmajor_step<Bc>(k)), k > 0);
        wgmma_commit();
        wgmma_wait<0>(); /* S_ij in registers (and O_i += P_{i,j-1} V_{j-1} done) */
        wgmma_hold(S_ij[0]);
        wgmma_hold(O_acc[0]);
        wgmma_hold(P_ij);
        if (TURNED && j > 0) release(j - 1); /* O_i += P_{i,j-1} V_{j-1} has read V_{j-1} */

        /* Masks, only on the tiles that need them: the tail tile (keys past N) and, when causal,
         * the tiles that cross the diagonal (some key after some query of this tile). */
        if (key0 + Bc > N || (causal && key0 + Bc - 1 > q0)) mask_scores(S_ij, key0, q0 + row0, N, causal);

        /* The online softmax (softmax.cuh): S_ij -> P_ij in place, m_i and l_i updated; O_i *= alpha */
        float alpha[M_TILES][2];
        online_softmax(S_ij, m_i, l_i, alpha, scale_log2);
        scale_rows(O_acc, alpha);
        count_rows<M_TILES>(tally, CNT_ROW_CORRECT, q0 + row0, N);
        /* P_ij packed into 16-bit A fragments: two n8 key tiles' C layout is one k16 step's A
         * layout (wgmma.cuh) */
#pragma unroll
        for (int kb = 0; kb < Bc / 16; kb++) {
            P_ij[kb][0] = M::pack(S_ij[0][2 * kb][0], S_ij[0][2 * kb][1]);
            P_ij[kb][1] = M::pack(S_ij[0][2 * kb][2], S_ij[0][2 * kb][3]);
            P_ij[kb][2] = M::pack(S_ij[0][2 * kb + 1][0], S_ij[0][2 * kb + 1][1]);
            P_ij[kb][3] = M::pack(S_ij[0][2 * kb + 1][2], S_ij[0][2 * kb + 1][3]);
        }
    };

    /* The loop, turned so that O_i += P_ij V_j is issued and left running while the warpgroup
     * waits for the next tile and issues the next S = Q K^T:
     *   tile 0:          wait for it, S_i0 -> P_i0
     *   tile j:          O_i += P_ij V_j (issued) | wait for tile j+1, S_{i,j+1} -> P_{i,j+1}
     * So a stage is released one tile late: V_j is read until the wait for S_{i,j+1}, after which
     * scores releases tile j (the last tile, after the loop). Not turned (TURNED = 0: d = 128 and
     * 256, configuration above), P_ij V_j is waited for at once and tile j released then. */
    mbar_wait(Q_full, 0); /* Q_i has landed (the barrier's one phase; no fence, as for K_j, V_j) */
    next_tile(0);
    scores(0);
    for (int j = 0; j < n_tiles; j++) {
        /* O_i += P_ij V_j: one m64nDk16 wgmma per k16 step of keys, all in one group */
        const uint64_t V_j = wgmma_desc_step(V_desc, (j % STAGES) * TILE_BYTES);
        wgmma_hold(O_acc[0]);
        wgmma_hold(P_ij);
        wgmma_fence(); /* O_acc (rescaled) and P_ij were just written by ordinary instructions */
#pragma unroll
        for (int kb = 0; kb < Bc / 16; kb++)
            wgmma_rs<T, HeadDim, 1>(O_acc[0], P_ij[kb], wgmma_desc_step(V_j, sw128_mnmajor_step(kb)), 1);
        wgmma_commit();
        if constexpr (!TURNED) {
            wgmma_wait<0>(); /* O_i updated; V_j and P_ij read */
            wgmma_hold(O_acc[0]);
            wgmma_hold(P_ij);
            release(j);
        }
        if (j + 1 < n_tiles) {
            next_tile(j + 1);
            scores(j + 1);
        }
    }
    wgmma_wait<0>(); /* the last O_i += P_ij V_j */
    wgmma_hold(O_acc[0]);
    if constexpr (TURNED) release(n_tiles - 1); /* (no copy waits for it: released all the same,
                                                  * so that every tile is released once) */

    /* The one normalization, O_i / l_i, and L = scale * m + log(l) in nats. O goes through this
     * warp's own rows of the Q tile in shared memory, then out in 16-byte stores along each row. */
    named_barrier_sync(1 + wg, WARPGROUP); /* a warpgroup's wgmma reads all 64 of its rows of Q_i: no
                                            * warp overwrites its rows before every warp of its
                                            * warpgroup is past its last wgmma (a barrier of the
                                            * warpgroup alone: the producer has left) */
    normalize_rows(O_acc, m_i, l_i, L, q0 + row0, N, scale_log2, tally);
    store_rows_sw128<Br, HeadDim>(O_acc, Q_i, O, q0, row0, N);
    tally.flush(counters);
}

/* ---- launcher ---- */

/* The HBM bytes the loop structure moves: Q once; K_j, V_j once per Q tile that sees them; O and L
 * once. (16-bit elements in both dtypes.) */
void hbm_bytes(const struct shape *sh, struct hbm_traffic *t)
{
    const double kv_rows = sh->d == 64 ? kv_rows_read<tiles<cfg<64>>>(sh) : sh->d == 128 ? kv_rows_read<tiles<cfg<128>>>(sh)
                           : kv_rows_read<tiles<cfg<256>>>(sh);
    const double heads = (double)sh->B * sh->H, d = sh->d, N = sh->N;
    t->Q = heads * N * d * 2;
    t->KV = heads * 2.0 * kv_rows * d * 2;
    t->O = heads * N * d * 2;
    t->O_work = 0;
    t->rowstats = heads * N * sizeof(float); /* L */
    t->q_reads = 1;
}

template <typename T, typename Cfg, bool COUNT>
int launch(const struct attn_args *a, char *why, size_t n)
{
    typedef tiles<Cfg> Tiles;
    constexpr int HeadDim = Tiles::HeadDim;
    const size_t smem = Tiles::bytes;
    if (int rc = smem_optin(stage12_warp_specialized_kernel<T, Cfg, COUNT>, smem, HeadDim, why, n)) return rc;

    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    if (bh > 2147483647LL) {
        snprintf(why, n, "batch * heads = %lld is more than a grid dimension holds (2^31 - 1)", bh);
        return ATTN_UNSUPPORTED;
    }
    /* The tensor maps, made on the host for this call's tensors (a few microseconds of CPU, no
     * GPU work) and passed by value: Q's boxes are Br rows, K's and V's Bc. */
    CUtensorMap tmap_Q, tmap_K, tmap_V;
    if (int rc = tma_map_heads<T>(&tmap_Q, (const T *)a->Q, bh, sh->N, HeadDim, Tiles::Br, why, n)) return rc;
    if (int rc = tma_map_heads<T>(&tmap_K, (const T *)a->K, bh, sh->N, HeadDim, Tiles::Bc, why, n)) return rc;
    if (int rc = tma_map_heads<T>(&tmap_V, (const T *)a->V, bh, sh->N, HeadDim, Tiles::Bc, why, n)) return rc;
    /* (batch, head) in x, Q tiles in y: at most 2^20 / Br <= 8192 tiles, under y's 65535 */
    const dim3 grid((unsigned)bh, CEIL_DIV(sh->N, Tiles::Br));
    const dim3 block(Tiles::NTHREADS);
    stage12_warp_specialized_kernel<T, Cfg, COUNT><<<grid, block, smem>>>(
        tmap_Q, tmap_K, tmap_V, (T *)a->O, a->L, sh->N, sh->causal, sh->scale * LOG2E, a->counters);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* dtype, head dim and counting build -> the kernel's template arguments; Cfg<HeadDim> is the
 * configuration of each head dim (the stage's: cfg) */
template <template <int> class Cfg, typename T, bool COUNT>
int dispatch_d(const struct attn_args *a, char *why, size_t n)
{
    switch (a->sh.d) {
    case 64: return launch<T, Cfg<64>, COUNT>(a, why, n);
    case 128: return launch<T, Cfg<128>, COUNT>(a, why, n);
    case 256: return launch<T, Cfg<256>, COUNT>(a, why, n);
    }
    snprintf(why, n, "supports head dim 64, 128 or 256 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

template <template <int> class Cfg, typename T>
int dispatch(const struct attn_args *a, char *why, size_t n)
{
    return a->counters ? dispatch_d<Cfg, T, true>(a, why, n) : dispatch_d<Cfg, T, false>(a, why, n);
}

/* The forward with the configurations Cfg<64>, Cfg<128>, Cfg<256>; the stage's is forward<cfg>. */
template <template <int> class Cfg>
int forward(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype == DT_F16) return dispatch<Cfg, __half>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch<Cfg, __nv_bfloat16>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

} // namespace

extern "C" const struct stage stage12_desc = {
    .name = "stage12",
    .idea = "Hopper: TMA loads by a producer warp through an mbarrier ring, consumer warpgroups compute, setmaxnreg",
    .device = ON_GPU,
    .forward = forward<cfg>,
    .backward = NULL,
    .dims = {64, 128, 256},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = NULL,
    .openmp = 0,
    .hbm_traffic = hbm_bytes,
    .measures_backward = 0,
    .arch_sm = 90,
};
