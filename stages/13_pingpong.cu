/* 13_pingpong.cu: FlashAttention-3's two overlaps on Hopper: the consumer warpgroups take turns at
 *   the tensor cores, and within a warpgroup the softmax of the next scores runs under P V
 *
 * Changed from stage 12: the producer, the ring, the grid and the math are stage 12's. Two things
 *   are new, both about when each warpgroup issues its wgmma:
 *   - Turns (FlashAttention-3's "ping-pong"). A consumer warpgroup issues its wgmma (O_i += P_ij V_j
 *     together with S_{i,j+1} = Q_i K_{j+1}^T) only in its turn, and hands the turn to the next
 *     warpgroup as soon as they are issued: one named barrier per warpgroup, waited on with bar.sync
 *     by its own 128 threads and completed by the previous warpgroup's bar.arrive (turn_begin,
 *     turn_end). So the warpgroups alternate, and one's softmax (exp2 on the MUFU units) runs while
 *     another's wgmma keep the tensor cores busy. In stage 12 nothing keeps them apart: they can
 *     drift into step, every softmax at once and the tensor cores idle.
 *   - The softmax under its own P V (FlashAttention-3's intra-warpgroup overlap): in its turn a
 *     warpgroup issues S_{i,j+1} = Q_i K_{j+1}^T first and O_i += P_ij V_j second, waits for S alone,
 *     and computes the softmax of S_{i,j+1} while the tensor cores still do P_ij V_j; O_i's rescale
 *     and P_{i,j+1}'s packing wait for P V (the kernel's OVERLAP).
 *   The tiles change with them: two consumer warpgroups at d = 128 (a ring of three stages, the
 *   loop turned), three at d = 64; d = 256 keeps stage 12's schedule (cfg below says why).
 * Why: per K/V tile the exponentials take half the tensor cores' time at d = 128 and as much at
 *   d = 64 (989 TFLOP/s of fp16 matmul against 3.9 T exp2/s on an H100 or H200: 4096 FLOPs against
 *   16 exp2 per clock and SM). Overlapped they cost nothing; one after the other, they stretch
 *   every tile by half (d = 128) or double it (d = 64).
 * Hopper only: compiled for sm_90a (the Makefile's HOPPER_STAGES); elsewhere it exits 3.
 * Ablations (bench/ablations/13_*.cu, timed by bench/ablate.sh): without the turns; without the
 *   softmax under P V. Measured on an H200: notes/13_pingpong.md.
 * Run: ./stage13 --batch 1 --heads 16 --seqlen 16384 --dim 128 --causal
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
 *                once and tile j's stage freed then: STAGES - 1 ahead;
 *   PINGPONG     1: the consumer warpgroups take turns at issuing their wgmma (the kernel's
 *                turn_begin, turn_end); needs TURNED, since a turn issues P_ij V_j and the next S;
 *   OVERLAP      1: in its turn a warpgroup issues the next S before P_ij V_j and computes that S's
 *                softmax while P_ij V_j runs; needs TURNED.
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
 *   d     consumer WGs  Br   Bc   STAGES  TURNED  turns, overlap  consumer registers        Q_i + ring
 *   64    3             192  128  4       1       yes             160: O 32 + S 64 + P 32   24 + 4 x 32 = 152 KiB
 *   128   2             128  128  3       1       yes             240: O 64 + S 64 + P 32   32 + 3 x 64 = 224 KiB
 *   256   2             128   64  2       0       no              240: O 128 + S 32 + P 16  64 + 2 x 64 = 192 KiB
 *
 * d = 64:  stage 12's tiles. A warpgroup's softmax, as long as its matmuls here, hides under two
 *          other warpgroups' turns, not one.
 * d = 128: two warpgroups, not stage 12's three: the overlap keeps P_{i,j+1} and O_i live beside
 *          S_{i,j+1} while P_ij V_j runs, and 160 registers would not hold them; with 240, a
 *          ring of three stages (Q_i is 128 rows), turned, as the turns need.
 * d = 256: stage 12's loop, no turns: a turn would hold the wait for P_ij V_j and keep the other
 *          warpgroup out for a whole matmul, and the softmax is a quarter of the matmuls' time,
 *          which the warpgroups' drift already hides (FlashAttention-3 leaves its turns out at
 *          d = 256 too).
 * What each choice measured: notes/13_pingpong.md. */
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { static constexpr int HeadDim = 64, NWARPGROUPS = 3, Bc = 128, STAGES = 4, TURNED = 1, PINGPONG = 1, OVERLAP = 1; };
template <>
struct cfg<128> { static constexpr int HeadDim = 128, NWARPGROUPS = 2, Bc = 128, STAGES = 3, TURNED = 1, PINGPONG = 1, OVERLAP = 1; };
template <>
struct cfg<256> { static constexpr int HeadDim = 256, NWARPGROUPS = 2, Bc = 64, STAGES = 2, TURNED = 0, PINGPONG = 0, OVERLAP = 0; };
constexpr int WARPGROUP = 4 * WARP_SIZE; /* threads that issue one wgmma together */
constexpr int PRODUCER_REGS = 24; /* setmaxnreg, per thread (above); the consumers' share: tiles */
constexpr size_t SMEM_MAX = 227 * 1024; /* the shared memory a block may have on an H100 or H200 */

/* Everything derived from a configuration: tile sizes, threads, registers, the shared-memory layout. */
template <typename Cfg>
struct tiles {
    static constexpr int HeadDim = Cfg::HeadDim, Bc = Cfg::Bc, STAGES = Cfg::STAGES;
    static constexpr bool TURNED = Cfg::TURNED != 0, PINGPONG = Cfg::PINGPONG != 0, OVERLAP = Cfg::OVERLAP != 0;
    static constexpr int NWARPGROUPS = Cfg::NWARPGROUPS; /* consumer warpgroups */
    static constexpr int NWARPS = 4 * NWARPGROUPS;     /* consumer warps */
    /* the wgmma accumulators give each warp 16 rows of its warpgroup's 64: one m16 row tile */
    static constexpr int M_TILES = 1;
    static constexpr int NTHREADS = NWARPS * WARP_SIZE + WARPGROUP; /* the consumers, then the producer */
    /* setmaxnreg (above): the registers each thread has at launch, and the consumers' share of what
     * the producer gives back: 240 with two consumer warpgroups, 160 with three */
    static constexpr int LAUNCH_REGS = 65536 / NTHREADS / 8 * 8;
    static constexpr int CONSUMER_REGS = (LAUNCH_REGS * NTHREADS - PRODUCER_REGS * WARPGROUP) / (NWARPS * WARP_SIZE) / 8 * 8;
    /* The named barriers (0 is __syncthreads'): 1 + wg, the epilogue of consumer warpgroup wg; then
     * TURN_BAR + wg, warpgroup wg's turn (3 and 4 with two warpgroups; 4, 5 and 6 with three) */
    static constexpr int TURN_BAR = 1 + NWARPGROUPS;
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
    static_assert(!PINGPONG || TURNED, "a turn issues P_ij V_j and S_{i,j+1} together and waits for neither");
    static_assert(!OVERLAP || TURNED, "the overlap leaves P_ij V_j running past the next S: a turned loop");
    static_assert(bytes <= SMEM_MAX, "Q_i and the ring fit the shared memory of one block");
    static_assert(PRODUCER_REGS * WARPGROUP + CONSUMER_REGS * NWARPS * WARP_SIZE <= LAUNCH_REGS * NTHREADS,
                  "the consumers take no more registers than the producer gives back");
    static_assert(CONSUMER_REGS <= 256, "setmaxnreg: at most 256 registers per thread");
    static_assert(TURN_BAR + NWARPGROUPS - 1 <= 15, "named barriers 1 .. 15: the epilogue's, the turns'");
};

/* ---- kernel ---- */

/* Cfg: a configuration (above). COUNT: the counting build for --counters (common/cuda/counters.cuh);
 * the timed build has none. */
template <typename T, typename Cfg, bool COUNT>
__global__ void __launch_bounds__(tiles<Cfg>::NTHREADS, 1)
stage13_pingpong_kernel(const __grid_constant__ CUtensorMap tmap_Q, const __grid_constant__ CUtensorMap tmap_K,
                        const __grid_constant__ CUtensorMap tmap_V, T *__restrict__ O, float *__restrict__ L,
                        int N, int causal, float scale_log2, unsigned long long *counters)
{
    typedef tiles<Cfg> Tiles;
    typedef mma16<T> M;
    constexpr int M_TILES = Tiles::M_TILES, Br = Tiles::Br, Bc = Tiles::Bc, STAGES = Tiles::STAGES;
    constexpr int HeadDim = Tiles::HeadDim;
    constexpr bool TURNED = Tiles::TURNED, PINGPONG = Tiles::PINGPONG, OVERLAP = Tiles::OVERLAP;
    constexpr int NWARPGROUPS = Tiles::NWARPGROUPS, NWARPS = Tiles::NWARPS, TURN_BAR = Tiles::TURN_BAR;
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

    /* The turns (PINGPONG), round robin: warpgroup 0, 1, 0, 1, ... with two consumer warpgroups,
     * 0, 1, 2, 0, 1, 2, ... with three. Warpgroup wg waits for its turn at named barrier
     * TURN_BAR + wg, which completes when its own 128 threads (bar.sync) and the 128 of the
     * warpgroup before it (bar.arrive) have come: turn_begin. Once its wgmma are issued it gives
     * the turn to the next warpgroup, an arrival on next's barrier: turn_end. The last warpgroup
     * hands the first turn to warpgroup 0 with an arrival before anything else; from then on the
     * turns go round in order, one at a time (each turn waits for the arrival that ends the turn
     * before it). So a warpgroup cannot arrive twice on next's barrier before next has synced there
     * once: between its two arrivals lies a turn of its own, which needed the turns of all the
     * others since its last one, next's among them. Every phase of each barrier is exactly one
     * sync and one arrival.
     *
     * The counts. Each warpgroup takes one turn per S = Q K^T it issues, n_tiles of them, and ends
     * each with one arrival. Every warpgroup has the same n_tiles: it is the block's (from the Q
     * tile's last row), not the warpgroup's. Under a causal mask a lower warpgroup's rows end 64
     * (or 128) rows before the tile's last, so its last K/V tile can be
     * wholly masked (P_ij = 0), and at the tail rows past N are zeros of Q_i: it computes them all
     * the same, and the turns and the ring's empty barriers (NWARPS warps per stage) count on that.
     * A warpgroup that skipped a tile would still have to take that turn (sync and arrive with no
     * wgmma between) and release the stage, or the others would wait forever. So warpgroup 0 syncs
     * n_tiles times on its barrier and the last warpgroup arrives there 1 + n_tiles times (the first
     * turn, handed over, and one per turn): at the end warpgroup 0 takes the turn nobody will use,
     * and each barrier ends on a whole phase. Every other warpgroup's barrier: n_tiles arrivals from
     * the warpgroup before it, n_tiles syncs. The last P_ij V_j is issued outside a turn: it
     * has no S with it, and holding the others for it would only delay their next S. */
    auto turn_begin = [&] {
        if constexpr (PINGPONG) named_barrier_sync(TURN_BAR + wg, 2 * WARPGROUP);
    };
    auto turn_end = [&] {
        /* the warpgroup whose turn follows this one's: 1 - wg of two, wg + 1 of three but 0 after 2 */
        const int next = NWARPGROUPS == 2 ? 1 - wg : wg + 1 < NWARPGROUPS ? wg + 1 : 0;
        if constexpr (PINGPONG) named_barrier_arrive(TURN_BAR + next, 2 * WARPGROUP);
    };
    if (wg == NWARPGROUPS - 1) turn_end(); /* the first turn is warpgroup 0's */

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
    /* S_ij = Q_i K_j^T issued (raw: the scale is applied inside the exponential), this
     * warpgroup's 64 rows: one m64nBck16 wgmma per k16 step of the head dim, the first one
     * overwriting S_ij (accumulate = 0), all in one group. S_ij[0]: a warp's one row tile. */
    auto issue_scores = [&](float (&S_ij)[M_TILES][KT][4], int j) {
        const uint64_t K_j = wgmma_desc_step(K_desc, (j % STAGES) * TILE_BYTES);
        wgmma_fence(); /* S_ij's registers were last written by ordinary instructions (tile j-1) */
#pragma unroll
        for (int k = 0; k < HeadDim / 16; k++)
            wgmma_ss<T, Bc, 0>(S_ij[0], wgmma_desc_step(Q_desc, sw128_kmajor_step<Br>(k)),
                               wgmma_desc_step(K_j, sw128_kmajor_step<Bc>(k)), k > 0);
        wgmma_commit();
    };

    /* O_i += P_ij V_j issued: one m64nDk16 wgmma per k16 step of keys, all in one group */
    auto issue_pv = [&](int j) {
        const uint64_t V_j = wgmma_desc_step(V_desc, (j % STAGES) * TILE_BYTES);
        wgmma_hold(O_acc[0]);
        wgmma_hold(P_ij);
        wgmma_fence(); /* O_acc (rescaled) and P_ij were just written by ordinary instructions */
#pragma unroll
        for (int kb = 0; kb < Bc / 16; kb++)
            wgmma_rs<T, HeadDim, 1>(O_acc[0], P_ij[kb], wgmma_desc_step(V_j, sw128_mnmajor_step(kb)), 1);
        wgmma_commit();
    };

    /* S_ij (in registers; key0 = j Bc, its first key) masked and through the online softmax: P_ij
     * in place, as fp32, and m_i, l_i updated. O_i's factor alpha is returned, not applied: with
     * OVERLAP the tensor cores are still adding P_{i,j-1} V_{j-1} into O_i while this runs. */
    auto softmax = [&](float (&S_ij)[M_TILES][KT][4], int key0, float (&alpha)[M_TILES][2]) {
        /* Masks, only on the tiles that need them: the tail tile (keys past N) and, when causal,
         * the tiles that cross the diagonal (some key after some query of this tile). */
        if (key0 + Bc > N || (causal && key0 + Bc - 1 > q0)) mask_scores(S_ij, key0, q0 + row0, N, causal);

        /* The online softmax (softmax.cuh): S_ij -> P_ij in place, m_i and l_i updated, alpha
         * returned; O_i *= alpha here only where nothing still adds into O_i (not OVERLAP) */
        online_softmax(S_ij, m_i, l_i, alpha, scale_log2);
        if constexpr (!OVERLAP) scale_rows(O_acc, alpha);
        count_rows<M_TILES>(tally, CNT_ROW_CORRECT, q0 + row0, N);
    };

    /* O_i *= alpha, then P_ij packed into 16-bit A fragments: two n8 key tiles' C layout is one
     * k16 step's A layout (wgmma.cuh) */
    auto rescale_pack = [&](const float (&S_ij)[M_TILES][KT][4], const float (&alpha)[M_TILES][2]) {
        if constexpr (OVERLAP) scale_rows(O_acc, alpha);
#pragma unroll
        for (int kb = 0; kb < Bc / 16; kb++) {
            P_ij[kb][0] = M::pack(S_ij[0][2 * kb][0], S_ij[0][2 * kb][1]);
            P_ij[kb][1] = M::pack(S_ij[0][2 * kb][2], S_ij[0][2 * kb][3]);
            P_ij[kb][2] = M::pack(S_ij[0][2 * kb + 1][0], S_ij[0][2 * kb + 1][1]);
            P_ij[kb][3] = M::pack(S_ij[0][2 * kb + 1][2], S_ij[0][2 * kb + 1][3]);
        }
    };

    /* Tile j's scores, not overlapped: S_ij issued (after O_i += P_{i,j-1} V_{j-1} when turned: the
     * tensor cores take this group right after it), the turn given away, and one wait for both;
     * then the softmax, O_i rescaled, P_ij packed. */
    auto scores = [&](int j) {
        const int key0 = j * Bc; /* first key of this tile */
        float S_ij[M_TILES][KT][4];
        issue_scores(S_ij, j);
        turn_end(); /* this turn's wgmma are issued: the tensor cores are the next warpgroup's */
        wgmma_wait<0>(); /* S_ij in registers (and O_i += P_{i,j-1} V_{j-1} done) */
        wgmma_hold(S_ij[0]);
        wgmma_hold(O_acc[0]);
        wgmma_hold(P_ij);
        if (TURNED && j > 0) release(j - 1); /* O_i += P_{i,j-1} V_{j-1} has read V_{j-1} */
        float alpha[M_TILES][2];
        softmax(S_ij, key0, alpha);
        rescale_pack(S_ij, alpha);
    };

    /* The loop, turned so that O_i += P_ij V_j is issued and left running while the warpgroup
     * waits for the next tile and issues the next S = Q K^T:
     *   tile 0:          wait for it, S_i0 -> P_i0
     *   tile j:          O_i += P_ij V_j (issued) | wait for tile j+1, S_{i,j+1} -> P_{i,j+1}
     * So a stage is released one tile late: V_j is read until the wait for S_{i,j+1}, after which
     * scores releases tile j (the last tile, after the loop). Not turned (d = 256, configuration
     * above), P_ij V_j is waited for at once and tile j released then.
     * With PINGPONG each S = Q K^T is issued in a turn, with the P V before it: the warpgroup
     * first waits for its tile (it never holds the turn while it waits on the copy engine), then
     * for its turn, issues, and gives the turn away (in scores) before it waits for its wgmma.
     * OVERLAP (FlashAttention-3's intra-warpgroup overlap) swaps the two in the turn and waits
     * for them apart: S_{i,j+1} first, then O_i += P_ij V_j; wait for S alone (the groups
     * complete in order), the softmax of S_{i,j+1} while the tensor cores do P_ij V_j; then
     * wait for P V, and only then O_i *= alpha and P_{i,j+1} packed (both overwrite registers
     * the running wgmma hold). */
    mbar_wait(Q_full, 0); /* Q_i has landed (the barrier's one phase; no fence, as for K_j, V_j) */
    next_tile(0);
    turn_begin();
    scores(0);
    if constexpr (OVERLAP) {
        for (int j = 0; j + 1 < n_tiles; j++) {
            next_tile(j + 1);
            turn_begin(); /* S_{i,j+1} and P_ij V_j go to the tensor cores in this turn */
            float S_ij[M_TILES][KT][4]; /* S_{i,j+1} */
            issue_scores(S_ij, j + 1); /* first: the group the softmax waits for */
            issue_pv(j);               /* second: left running under the softmax */
            turn_end();
            wgmma_wait<1>(); /* S_{i,j+1} in registers; O_i += P_ij V_j may still be running */
            wgmma_hold(S_ij[0]);
            float alpha[M_TILES][2];
            softmax(S_ij, (j + 1) * Bc, alpha); /* exp2 on the MUFU units, P_ij V_j on the tensor cores */
            /* O_i += P_ij V_j done: O_i is ours again, P_ij's registers free. wgmma_wait_here: a
             * plain wait ptxas would place above the softmax (wgmma.cuh), leaving it nothing to overlap */
            wgmma_wait_here<0>(j);
            wgmma_hold(O_acc[0]);
            wgmma_hold(P_ij);
            release(j); /* tile j's stage: K_j read long ago, V_j now */
            rescale_pack(S_ij, alpha);
        }
        issue_pv(n_tiles - 1); /* the last P V, outside any turn (below) */
    } else {
        for (int j = 0; j < n_tiles; j++) {
            if (PINGPONG && j + 1 < n_tiles) {
                next_tile(j + 1);
                turn_begin(); /* P_ij V_j and S_{i,j+1} go to the tensor cores in this turn */
            }
            issue_pv(j);
            if constexpr (!TURNED) {
                wgmma_wait<0>(); /* O_i updated; V_j and P_ij read */
                wgmma_hold(O_acc[0]);
                wgmma_hold(P_ij);
                release(j);
            }
            if (j + 1 < n_tiles) {
                if (!PINGPONG) next_tile(j + 1);
                scores(j + 1);
            }
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
    if (wg == 0) turn_begin(); /* the turn the last warpgroup handed over, which nobody takes (the counts) */
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
    if (int rc = smem_optin(stage13_pingpong_kernel<T, Cfg, COUNT>, smem, HeadDim, why, n)) return rc;

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
    /* (batch, head) in x, Q tiles in y: at most 2^20 / 128 = 8192 tiles, under y's 65535 */
    const dim3 grid((unsigned)bh, CEIL_DIV(sh->N, Tiles::Br));
    const dim3 block(Tiles::NTHREADS);
    stage13_pingpong_kernel<T, Cfg, COUNT><<<grid, block, smem>>>(
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

extern "C" const struct stage stage13_desc = {
    .name = "stage13",
    .idea = "Hopper: the consumer warpgroups take turns at the tensor cores, the softmax under P V",
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
