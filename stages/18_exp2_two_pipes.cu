/* 18_exp2_two_pipes.cu: the softmax's exponentials on two pipes: a share computed by a polynomial
 *   on the FMA units, beside the special-function unit's ex2
 *
 * Changed from stage 17: one thing, in online_softmax_stale's exponentials. Every POLY_EVERY-th n8
 *   tile of a row's scores goes through exp2_poly (common/cuda/exp2_poly.cuh: 2^x as 2^j p(f),
 *   j = rint(x) by a magic-number add, p a degree-5 minimax polynomial, j added to the exponent
 *   bits: in the SASS three FADD, five FFMA, one IMAD and a compare and select, 11 instructions
 *   where MUFU takes one), the rest through MUFU's ex2.approx as before. The share per head dim is
 *   in cfg: an eighth at d = 64, none at d = 128 and 256 (stage 17's exponentials there).
 * Why: MUFU does 16 ex2 per clock and SM, 8 clocks per warp instruction on each of the four
 *   schedulers, which issue one warp instruction per clock. At d = 64 a warp's unmasked tile is 66
 *   MUFU.EX2 (528 clocks of its scheduler's MUFU) and 425 instructions in all (425 issue clocks);
 *   three warps share a scheduler: MUFU 1584 clocks a round, issue 1275, the tensor cores' share of
 *   the round's matmuls 1536. Moving a share r of the 64 exponentials to the polynomial takes
 *   1536 r off MUFU and puts 1920 r on instruction issue: MUFU falls under the tensor cores' 1536 at
 *   r = 1/32, issue rises above them at r ~ 0.136, and in between the tensor cores bind. So in this
 *   model any share from 1/32 to about 1/7 buys MUFU's whole lead, about 3%, and a quarter costs
 *   about 11% (issue 1758 clocks). It is a throughput model: where the loop's latency sets the pace
 *   (Nsight Compute has stage 14's MUFU 59% busy at d = 64: notes/18_exp2_two_pipes.md), it is a
 *   ceiling, and the best share may be 0. bench/ablations/18_* build the shares 1/16 and 1/4.
 *   The polynomial's relative error, 1.87e-7 (3.1 units of 2^-24), is of the order of MUFU's own:
 *   it moves l_i, hence L = m + log l_i, by at most that, where the suite allows L at least 72
 *   units of 2^-24 (common/check.c; a degree-3 polynomial, 7.5e-5, 1250 units, failed it).
 * Hopper only: compiled for sm_90a (the Makefile's HOPPER_STAGES); elsewhere it exits 3.
 * The model, the SASS, the error bound and the time: notes/18_exp2_two_pipes.md.
 * Run: ./stage18 --batch 4 --heads 32 --seqlen 4096 --dim 64 */
#include "common/attn.h"
#include "common/cuda/counters.cuh"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/exp2_poly.cuh"
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
 *                softmax while P_ij V_j runs; needs TURNED;
 *   POLY_EVERY   k > 0: the exponentials of every k-th n8 tile of S_ij's columns are computed on the
 *                FMA pipe (exp2_poly, common/cuda/exp2_poly.cuh), the others by MUFU's ex2; 0: all
 *                by MUFU; -1 (the floor ablation bench/ablations/18_free_exp.cu only): none at all,
 *                P = the exponent itself, a wrong result timed to show what free exponentials buy;
 *                other negative values: the floors of bench/ablations/18_exp_only.cuh, which put
 *                their own tile_softmax in place;
 *   EARLY_Q      1: each consumer warp frees Q_i for the next work item's as soon as the item's last
 *                S = Q K^T has completed, not after the epilogue, so that the next Q_i is copied
 *                under the item's last P V, softmax and epilogue instead of before the next item's
 *                first S. The epilogue then cannot stage O through Q_i: it stores O from the
 *                accumulators straight to global memory.
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
 * have 227 KiB; the mbarriers add 16 bytes per stage and 16 for Q_i, full and empty, and the next
 * work item's number 4):
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
 * EARLY_Q at d = 64 only: at d = 128 and 256 O keeps its staging through Q_i and its 16-byte
 * stores (the early Q_i measured below 1x there: notes/14_persistent.md).
 * POLY_EVERY: 8 at d = 64 (r = 1/8: inside [1/32, 1/7], where the throughput model of
 * notes/18_exp2_two_pipes.md has the tensor cores, not MUFU or issue, bind; on an H200 in 16-bit no
 * share measures faster than none, and 1/8 is kept so that the stage runs its idea); 0 at d = 128 (MUFU's
 * time is half the tensor cores' there, and the smallest share, 1/16, measured 2% slower than none:
 * bench/ablations/18_more_poly.cu builds it) and at d = 256 (the softmax is a quarter of the
 * matmuls'); bench/ablations/18_more_poly.cu and 18_less_poly.cu time twice and half the d = 64
 * share, stage 17 none.
 * Short causal problems at d = 64 take two consumer warpgroups (short_causal, below).
 * What each choice measured: notes/13_pingpong.md, notes/14_persistent.md, notes/18_exp2_two_pipes.md. */
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { static constexpr int HeadDim = 64, NWARPGROUPS = 3, Bc = 128, STAGES = 4, TURNED = 1, PINGPONG = 1, OVERLAP = 1, EARLY_Q = 1, POLY_EVERY = 8; };
template <>
struct cfg<128> { static constexpr int HeadDim = 128, NWARPGROUPS = 2, Bc = 128, STAGES = 3, TURNED = 1, PINGPONG = 1, OVERLAP = 1, EARLY_Q = 0, POLY_EVERY = 0; };
template <>
struct cfg<256> { static constexpr int HeadDim = 256, NWARPGROUPS = 2, Bc = 64, STAGES = 2, TURNED = 0, PINGPONG = 0, OVERLAP = 0, EARLY_Q = 0, POLY_EVERY = 0; };
/* Under a causal mask the Q tiles of 192 rows reach far past the diagonal where a head has few of
 * them: at N = 1024, six (the last of 64 queries) compute 32 tiles of 192 x 128 scores, 786k for
 * the 525k the mask keeps (67%), where eight tiles of 128 rows compute 590k (89%). So at d = 64,
 * under the mask and for N <= SHORT_CAUSAL_N, the kernel runs with two consumer warpgroups
 * (short_causal<Cfg>: Br = 128), which took 0.87x the time at N = 1024 and 0.90x at 512, and
 * 1.01x at 2048 (notes/14_persistent.md); without the mask three stay faster at every N. */
template <typename Cfg>
struct short_causal : Cfg { static constexpr int NWARPGROUPS = 2; };
constexpr int SHORT_CAUSAL_N = 1024;
static bool takes_short_causal(const struct shape *sh)
{
    return sh->d == 64 && sh->causal && sh->N <= SHORT_CAUSAL_N;
}
constexpr int WARPGROUP = 4 * WARP_SIZE; /* threads that issue one wgmma together */
constexpr int PRODUCER_REGS = 24; /* setmaxnreg, per thread (above); the consumers' share: tiles */
constexpr size_t SMEM_MAX = 227 * 1024; /* the shared memory a block may have on an H100 or H200 */

/* Everything derived from a configuration: tile sizes, threads, registers, the shared-memory layout. */
template <typename Cfg>
struct tiles {
    static constexpr int HeadDim = Cfg::HeadDim, Bc = Cfg::Bc, STAGES = Cfg::STAGES;
    static constexpr bool TURNED = Cfg::TURNED != 0, PINGPONG = Cfg::PINGPONG != 0, OVERLAP = Cfg::OVERLAP != 0;
    static constexpr bool EARLY_Q = Cfg::EARLY_Q != 0;
    static constexpr int POLY_EVERY = Cfg::POLY_EVERY; /* 0, or every POLY_EVERY-th n8 tile by the polynomial */
    static constexpr int NWARPGROUPS = Cfg::NWARPGROUPS; /* consumer warpgroups */
    static constexpr int NWARPS = 4 * NWARPGROUPS;     /* consumer warps */
    /* the wgmma accumulators give each warp 16 rows of its warpgroup's 64: one m16 row tile */
    static constexpr int M_TILES = 1;
    static constexpr int NTHREADS = NWARPS * WARP_SIZE + WARPGROUP; /* the consumers, then the producer */
    /* setmaxnreg (above): the registers each thread has at launch, and the consumers' share of what
     * the producer gives back: 240 with two consumer warpgroups, 160 with three */
    static constexpr int LAUNCH_REGS = 65536 / NTHREADS / 8 * 8;
    static constexpr int CONSUMER_REGS = (LAUNCH_REGS * NTHREADS - PRODUCER_REGS * WARPGROUP) / (NWARPS * WARP_SIZE) / 8 * 8;
    /* The named barriers (0 is __syncthreads'): 1 + wg, the epilogue of consumer warpgroup wg (not
     * used with EARLY_Q, whose epilogue does not touch shared memory); then
     * TURN_BAR + wg, warpgroup wg's turn (3 and 4 with two warpgroups; 4, 5 and 6 with three) */
    static constexpr int TURN_BAR = 1 + NWARPGROUPS;
    static constexpr int ROWS_PER_WARP = 16 * M_TILES;
    static constexpr int Br = NWARPS * ROWS_PER_WARP;
    /* Q_i [Br][HeadDim], then the ring: STAGES buffers of K_j [Bc][HeadDim], STAGES of V_j, all
     * 16-bit, in the 128-byte swizzle (wgmma.cuh): each starts on a 1024-byte atom. Then the
     * mbarriers, 8 bytes each: full[STAGES], empty[STAGES], Q_full, Q_empty; then a slot for the
     * number of the block's next work item, which lands with its Q_i (-1: none, the block is done;
     * the item hand-over in the kernel). */
    static constexpr size_t Q_i = 0;
    static constexpr size_t K_j = Q_i + 2 * (size_t)Br * HeadDim;
    static constexpr size_t V_j = K_j + STAGES * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t full = V_j + STAGES * 2 * (size_t)Bc * HeadDim;
    static constexpr size_t empty = full + STAGES * sizeof(uint64_t);
    static constexpr size_t Q_full = empty + STAGES * sizeof(uint64_t);
    static constexpr size_t Q_empty = Q_full + sizeof(uint64_t);
    static constexpr size_t item_slot = Q_empty + sizeof(uint64_t);
    static constexpr size_t bytes = item_slot + sizeof(int);
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

/* ---- the stale max ---- */

/* TAU: how far, in log2 units, a tile's row max may rise above the running max m_i before m_i
 * moves and O_i and l_i are rescaled. Below it the tile's P = exp2(scale_log2 S - scale_log2 m_i)
 * is at most 2^TAU = 256: far inside fp16's and bf16's range (65504; 3.4e38), so P_ij still packs
 * into the 16-bit operand of P V with its full relative precision, and l_i (at most N 2^TAU) and O_i
 * stay far from fp32's limits. (Not so in an FP8 forward: it carries P scaled up into P V, e.g.
 * 256 P to keep small P out of e4m3's subnormals, and e4m3's largest value is 448, so P up to
 * 2^TAU under a stale max would overflow; an FP8 forward keeps the exact max, P <= 1.)
 * The result is exact whichever m a row keeps: O_i and l_i are both sums of exp2(s - m) against the
 * same m, so the division O_i / l_i and L = m + log l do not depend on it. */
constexpr float TAU = 8.f;

/* One tile of the online softmax (softmax.cuh's online_softmax), with the max kept stale:
 *   m_new = max(m_i, rowmax(S));  a row moves to m_new only if scale_log2 (m_new - m_i) > TAU
 *   (or m_i is -inf and m_new is not: the row's first unmasked key), else keeps m_i;
 *   P = exp2(scale_log2 S - scale_log2 m);  alpha = exp2(scale_log2 (m_i - m)), 1 where m_i stayed;
 *   l_i = alpha l_i + rowsum(P).
 * moved[mt][h]: whether this lane's row moved. Returns whether any of this lane's rows moved: the
 * caller's vote over the warp (the kernel's softmax) then rescales O_i by alpha (1 on the rows that
 * stayed) or not at all, without diverging. A row that stays -inf (every key so far masked) has
 * P = 0 and alpha = 1. No branch anywhere in it (below). */
template <int POLY_EVERY, int M_TILES, int KT>
__device__ __forceinline__ bool online_softmax_stale(float (&S)[M_TILES][KT][4], float (&m_i)[M_TILES][2],
                                                     float (&l_i)[M_TILES][2], float (&alpha)[M_TILES][2],
                                                     bool (&moved)[M_TILES][2], float scale_log2)
{
    bool any = false;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = m_i[mt][h];
#pragma unroll
            for (int nt = 0; nt < KT; nt++) mx = fmaxf(mx, fmaxf(S[mt][nt][2 * h], S[mt][nt][2 * h + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1)); /* the quad holds the row */
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            /* scale_log2 > 0: the two products rounded alike (__fmul_rn), as in online_softmax */
            const float old_l2 = __fmul_rn(m_i[mt][h], scale_log2), new_l2 = __fmul_rn(mx, scale_log2);
            /* One comparison, no branch: mx >= m_i, so the difference is 0 where the max stands,
             * +inf at the row's first unmasked key (m_i = -inf) and NaN, which compares false, while
             * every key so far is masked (-inf - -inf). Written as mx > m_i && (m_i == -inf || ...),
             * the test compiles to two divergent branches per tile (BSSY ... BSYNC) and 20 more
             * instructions in the loop */
            const bool move = new_l2 - old_l2 > TAU;
            const float m = move ? mx : m_i[mt][h], m_l2 = move ? new_l2 : old_l2;
            const float base = m == -INFINITY ? 0.f : m_l2;
            alpha[mt][h] = move ? exp2_approx(old_l2 - base) : 1.f;
            m_i[mt][h] = m, moved[mt][h] = move, any |= move;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < KT; nt++) {
                const float x0 = fmaf(S[mt][nt][2 * h], scale_log2, -base);
                const float x1 = fmaf(S[mt][nt][2 * h + 1], scale_log2, -base);
                /* every POLY_EVERY-th n8 tile on the FMA pipe, the rest on MUFU: nt is a
                 * compile-time constant here (unrolled), so the choice costs nothing */
                constexpr int EVERY = POLY_EVERY > 0 ? POLY_EVERY : 1; /* (no % 0 where there is none) */
                const bool poly = POLY_EVERY > 0 && nt % EVERY == EVERY - 1;
                /* POLY_EVERY < 0 (bench/ablations/18_free_exp.cu, a floor): no exponential at all */
                const float p0 = POLY_EVERY < 0 ? x0 : poly ? exp2_poly(x0) : exp2_approx(x0);
                const float p1 = POLY_EVERY < 0 ? x1 : poly ? exp2_poly(x1) : exp2_approx(x1);
                S[mt][nt][2 * h] = p0, S[mt][nt][2 * h + 1] = p1;
                sum += p0 + p1;
            }
            l_i[mt][h] = alpha[mt][h] * l_i[mt][h] + sum;
        }
    return any;
}

/* A tile's softmax for a POLY_EVERY: online_softmax_stale. A class template, not a bare call, so
 * that a floor can put another softmax in its place for a POLY_EVERY of its own
 * (bench/ablations/18_exp_only.cuh). */
template <int POLY_EVERY>
struct tile_softmax {
    template <int M_TILES, int KT>
    static __device__ __forceinline__ bool run(float (&S)[M_TILES][KT][4], float (&m_i)[M_TILES][2],
                                               float (&l_i)[M_TILES][2], float (&alpha)[M_TILES][2],
                                               bool (&moved)[M_TILES][2], float scale_log2)
    {
        return online_softmax_stale<POLY_EVERY>(S, m_i, l_i, alpha, moved, scale_log2);
    }
};

/* --counters: one rescale counted per row of the warp that moved its max (rows past N are not) */
template <int M_TILES, class Tally>
__device__ __forceinline__ void count_moved(Tally &tally, const bool (&moved)[M_TILES][2], int query0, int N)
{
    const int lane = threadIdx.x % WARP_SIZE, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            if (t == 0 && moved[mt][h] && query0 + mt * 16 + 8 * h + g < N) tally.add(CNT_ROW_CORRECT);
}

/* ---- kernel ---- */

/* Cfg: a configuration (above). COUNT: the counting build for --counters (common/cuda/counters.cuh);
 * the timed build has none. */
template <typename T, typename Cfg, bool COUNT>
__global__ void __launch_bounds__(tiles<Cfg>::NTHREADS, 1)
stage18_exp2_two_pipes_kernel(const __grid_constant__ CUtensorMap tmap_Q, const __grid_constant__ CUtensorMap tmap_K,
                        const __grid_constant__ CUtensorMap tmap_V, T *__restrict__ O_all, float *__restrict__ L_all,
                        int N, int BH, int section, int causal, float scale_log2, unsigned *__restrict__ next_item,
                        unsigned long long *counters)
{
    typedef tiles<Cfg> Tiles;
    typedef mma16<T> M;
    constexpr int M_TILES = Tiles::M_TILES, Br = Tiles::Br, Bc = Tiles::Bc, STAGES = Tiles::STAGES;
    constexpr int HeadDim = Tiles::HeadDim;
    constexpr bool TURNED = Tiles::TURNED, PINGPONG = Tiles::PINGPONG, OVERLAP = Tiles::OVERLAP, EARLY_Q = Tiles::EARLY_Q;
    constexpr int NWARPGROUPS = Tiles::NWARPGROUPS, NWARPS = Tiles::NWARPS, TURN_BAR = Tiles::TURN_BAR;
    constexpr int KT = Bc / 8;      /* key tiles: n8 tiles of S_ij */
    constexpr int DT = HeadDim / 8; /* dim tiles: n8 column tiles of O_i */
    extern __shared__ __align__(SW128_ATOM_BYTES) unsigned char smem[];
    T *Q_i = (T *)(smem + Tiles::Q_i);
    T *K_buf = (T *)(smem + Tiles::K_j); /* [STAGES][Bc][HeadDim] */
    T *V_buf = (T *)(smem + Tiles::V_j); /* [STAGES][Bc][HeadDim] */
    uint64_t *full = (uint64_t *)(smem + Tiles::full);   /* [STAGES]: stage s's K_j, V_j have landed */
    uint64_t *empty = (uint64_t *)(smem + Tiles::empty); /* [STAGES]: every consumer warp is done with it */
    uint64_t *Q_full = (uint64_t *)(smem + Tiles::Q_full); /* Q_i and its item's number have landed */
    uint64_t *Q_empty = (uint64_t *)(smem + Tiles::Q_empty); /* every consumer warp has stored its O rows
                                                               * through Q_i (EARLY_Q: has had its last
                                                               * S = Q K^T): the next Q_i may come */
    int *item_slot = (int *)(smem + Tiles::item_slot); /* the block's next work item, with its Q_i */

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;      /* groupID, tid_in_group (see mma.cuh) */
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

    /* The work: one item per (Q tile, head), Tr * BH of them, numbered by sections of `section`
     * heads (the last section may have fewer): within a section rank by rank, heaviest first, and
     * within a rank head by head. Rank 0 is, with a causal mask, the last Q tile (it sees the most
     * K/V tiles). Why sections: the blocks running at once take consecutive items, and every item
     * reads all of its head's K and V (up to its Q tile, causal). Numbered head by head within a
     * rank across all B * H heads, 132 items at once are 132 heads at N = 1024, each head's K/V read
     * from HBM again by each of its Q tiles, rounds apart, long evicted from the L2 (at d = 128 that
     * is 1 GB of K/V reads for 0.27 GB of Q, K, V and O). The host picks `section` so that a
     * section's K and V fit half the L2 (section_heads; notes/14_persistent.md): its items'
     * K/V tiles are read from HBM about once, then from the L2. (A section of every head is the
     * order without sections, which bench/ablations/14_one_section.cu builds.)
     * A block takes items one at a time: first item blockIdx.x (blocks start in that order), then
     * whichever is next when its producer asks, from a counter in global memory (take_item), so a
     * block that had light items takes more of them. Under a causal mask the items of a section
     * go from heavy to light and the next section starts heavy again: a fixed share per block (a
     * snake order) leaves some blocks every heavy item where a section is shorter than a few
     * rounds of the grid (d = 256 at N = 16k: one head a section, 128 items for 132 blocks).
     * Taking the next item when free is within one item of even whatever the order (list
     * scheduling), and the last items are the lightest. -1: past the last item.
     * The counter goes round once per call: each of the `items` items past the first gridDim.x is
     * handed out once and each block asks once more to hear there is none, `items` asks in all,
     * and atomicInc(p, items - 1) stores 0 on the last: zero for the next call (the harness zeroes
     * the workspace once). */
    const int Tr = CEIL_DIV(N, Br), items = Tr * BH;
    auto take_item = [&] { /* by the producer warp: its lane 0 asks, every lane gets the answer */
        long long w = 0;
        if (lane == 0) w = (long long)gridDim.x + atomicInc(next_item, (unsigned)items - 1);
        w = __shfl_sync(FULL_MASK, w, 0);
        return w < items ? (int)w : -1;
    };
    /* The hand-over. Only the producer learns the item numbers; the consumers learn each with its
     * Q_i. The issuing lane writes the number into item_slot, then makes the arrival on Q_full
     * that announces Q_i's bytes: an arrival releases the thread's earlier writes, and the wait
     * that sees the phase complete acquires them, so the consumers' wait for Q_i is their wait for
     * the number, and nothing holds the producer (it goes on to the item's later tiles at once).
     * The slot is free again when Q_i's buffer is: the producer writes it after the phase of
     * Q_empty, on which the lane that read it arrives after its read. After the last item the
     * number is -1, alone in a phase of Q_full (an arrival, no bytes). Both sides use atomics
     * for the slot, one per item and warp: the mbarrier orders them, but compute-sanitizer's race
     * checker does not follow an mbarrier's order between ordinary stores and loads, and it ignores
     * atomics. (A meeting of producer and consumers at a named barrier would hold the producer's
     * copies back until every warpgroup had reached the item.) */
    /* item w's head (the tensor maps' outermost coordinate), first query row, and K/V tiles: all of
     * them, or (causal) up to the one holding its last row */
    const int Tc = CEIL_DIV(N, Bc);
    struct work { int bh, q0, n_tiles; };
    auto work_of = [&](int w) {
        const int sec = w / (section * Tr), in_sec = w - sec * section * Tr; /* its section, its place in it */
        const int h0 = sec * section, heads = min(section, BH - h0);         /* the section's heads */
        const int rank = in_sec / heads, i = causal ? Tr - 1 - rank : rank, q0 = i * Br;
        return work{h0 + in_sec % heads, q0, causal ? min(Tc, (min(q0 + Br, N) - 1) / Bc + 1) : Tc};
    };
    work_tally<COUNT> tally;

    /* The barriers, by one thread: full[s] completes a phase when the producer has arrived (1) and
     * the bytes it announced have landed; empty[s] when each of the NWARPS consumer warps has
     * arrived once (one lane per warp, after the warp's wait for its wgmma); Q_empty likewise,
     * after the warp's O rows have left through Q_i (EARLY_Q: after its wait for its last S). */
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], NWARPS);
        mbar_init(Q_full, 1), mbar_init(Q_empty, NWARPS);
        mbar_fence_init(); /* visible to the copy engine, which completes them */
    }
    __syncthreads(); /* the barriers initialized before any thread waits on them or issues a copy;
                      * the last barrier of the whole block (the producer's idle warps leave) */

    if (wg == NWARPGROUPS) {
        /* ---- the producer: one warp; its lane 0 issues every copy, takes the items and hands them
         * over with Q_i, the other lanes wait with it (take_item shares the answer by a shuffle);
         * the rest of the warpgroup leaves ---- */
        setmaxnreg_dec<PRODUCER_REGS>(); /* the whole warpgroup, together: its registers to the pool */
        if (warp == NWARPS) {
            const bool issuer = lane == 0;
            if (issuer) tma_prefetch_map(&tmap_Q), tma_prefetch_map(&tmap_K), tma_prefetch_map(&tmap_V);
            int it0 = 0; /* K/V tiles copied for this block's earlier items: the ring runs on across items */
            for (int nth = 0, w = (int)blockIdx.x;; nth++) {
                if (w < 0) { /* no more: -1 where the next Q_i would have come (nth > 0: blockIdx.x < items) */
                    mbar_wait(Q_empty, (nth - 1) & 1);
                    if (issuer) atomicExch(item_slot, -1), mbar_arrive(Q_full);
                    break;
                }
                const work W = work_of(w);
                /* K_j, V_j, this item's tile j, the block's tile it = it0 + j, into stage it % STAGES,
                 * the (it / STAGES)-th time round the ring. From the second round on the stage must
                 * first be empty: its previous tile, it - STAGES, read by every consumer warp, the
                 * phase (it / STAGES - 1) of empty[s]. */
                auto load_kv = [&](int j) {
                    const int s = (it0 + j) % STAGES, round = (it0 + j) / STAGES;
                    if (round > 0) mbar_wait(&empty[s], (round - 1) & 1);
                    if (!issuer) return;
                    mbar_arrive_expect_tx(&full[s], 2 * TILE_BYTES); /* K_j and V_j: the phase ends when both land */
                    for (int cb = 0; cb < HeadDim / 64; cb++) {
                        tma_load_3d(K_buf + s * Bc * HeadDim + cb * Bc * 64, &tmap_K, &full[s], cb * 64, j * Bc, W.bh);
                        tma_load_3d(V_buf + s * Bc * HeadDim + cb * Bc * 64, &tmap_V, &full[s], cb * 64, j * Bc, W.bh);
                    }
                };
                /* Q_i's buffer is where the previous item's O rows leave from (the epilogue), so the
                 * nth Q_i waits for the (nth - 1)-th phase of Q_empty. Before that wait, the tiles whose
                 * stages the previous items free (j < STAGES: their stage's last tile is an earlier
                 * item's, released before its epilogue), so that they are in by the time Q_i is;
                 * tiles j >= STAGES need this item's consumers, so they come after Q_i.
                 * EARLY_Q: the (nth - 1)-th phase of Q_empty completes at the previous item's last
                 * S, while its consumers still hold the stages of its last HELD tiles: the last
                 * tile's V_j, which its last P V reads, and with OVERLAP the one before it too (that
                 * P V still runs under the softmax). A tile waiting for one of those stages before
                 * Q_i would hold Q_i's copy back to the end of that P V, so only the tiles whose
                 * stage is free by then come first (j < STAGES - HELD), the rest after Q_i. */
                constexpr int HELD = OVERLAP ? 2 : 1;
                const int early = nth == 0 ? 0 : min(W.n_tiles, EARLY_Q ? STAGES - HELD : STAGES);
                for (int j = 0; j < early; j++) load_kv(j);
                if (nth > 0) mbar_wait(Q_empty, (nth - 1) & 1);
                /* the item's number, then Q_i: HeadDim / 64 boxes of 64 columns x Br rows, one per
                 * column block */
                if (issuer) {
                    atomicExch(item_slot, w); /* before the arrival that releases it */
                    mbar_arrive_expect_tx(Q_full, 2 * Br * HeadDim);
                    for (int cb = 0; cb < HeadDim / 64; cb++)
                        tma_load_3d(Q_i + cb * Br * 64, &tmap_Q, Q_full, cb * 64, W.q0, W.bh);
                }
                for (int j = early; j < W.n_tiles; j++) load_kv(j);
                it0 += W.n_tiles;
                w = take_item();
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
     * The counts. Each warpgroup takes one turn per S = Q K^T it issues, n_tiles per work item, and
     * ends each with one arrival. Every warpgroup has the same n_tiles on every item: it is the
     * block's (from the Q tile's last row), not the warpgroup's. Under a causal mask a lower
     * warpgroup's rows end 64 (or 128) rows before the tile's last, so its last K/V tile can be
     * wholly masked (P_ij = 0), and at the tail rows past N are zeros of Q_i: it computes them all
     * the same, and the turns and the ring's empty barriers (NWARPS warps per stage) count on that.
     * A warpgroup that skipped a tile would still have to take that turn (sync and arrive with no
     * wgmma between) and release the stage, or the others would wait forever. So over the block,
     * with T the K/V tiles of all its items together, warpgroup 0 syncs T times on its barrier and the last warpgroup arrives there 1 + T times (the
     * first turn, handed over, and one per turn): after the last item warpgroup 0 takes the turn
     * nobody will use, and each barrier ends on a whole phase. Every other warpgroup's barrier: T
     * arrivals from the warpgroup before it, T syncs. The last P_ij V_j of an item is issued
     * outside a turn: it has no S with it, and holding the others for it would only delay their
     * next S. */
    auto turn_begin = [&] {
        if constexpr (PINGPONG) named_barrier_sync(TURN_BAR + wg, 2 * WARPGROUP);
    };
    auto turn_end = [&] {
        /* the warpgroup whose turn follows this one's: 1 - wg of two, wg + 1 of three but 0 after 2 */
        const int next = NWARPGROUPS == 2 ? 1 - wg : wg + 1 < NWARPGROUPS ? wg + 1 : 0;
        if constexpr (PINGPONG) named_barrier_arrive(TURN_BAR + next, 2 * WARPGROUP);
    };
    if (wg == NWARPGROUPS - 1) turn_end(); /* the first turn is warpgroup 0's */

    int it0 = 0; /* K/V tiles this block's consumers have had in earlier items (the ring's count) */
    for (int nth = 0;; nth++) {
        /* the block's nth Q_i has landed, and with it the item's number (the hand-over above); Q_i
         * was the copy engine's write, read by wgmma: no fence */
        mbar_wait(Q_full, nth & 1);
        int w = 0;
        if (lane == 0) w = atomicAdd(item_slot, 0); /* one read a warp (the hand-over above) */
        w = __shfl_sync(FULL_MASK, w, 0);
        if (w < 0) break; /* no more items */
        const work W = work_of(w);
        const int q0 = W.q0, n_tiles = W.n_tiles; /* first query row of this tile; its K/V tiles */
        T *O = O_all + (size_t)W.bh * N * HeadDim;
        float *L = L_all + (size_t)W.bh * N;

        /* This lane's rows are row0 + 16 mt + 8 h + g (mt < M_TILES, h = 0, 1). m_i is the running
         * max of the raw scores (not yet scaled); l_i is this lane's part of the row sum (its 2 of
         * every 8 columns), added across the quad only at the end. P_ij is the A operand of
         * O_i += P_ij V_j, packed to 16 bits. */
        float O_acc[M_TILES][DT][4] = {};
        float m_i[M_TILES][2], l_i[M_TILES][2];
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++) m_i[mt][0] = m_i[mt][1] = -INFINITY, l_i[mt][0] = l_i[mt][1] = 0.f;
        uint32_t P_ij[Bc / 16][4];

        /* Tile j's K_j, V_j have landed in ring stage (it0 + j) mod STAGES: the ((it0 + j) / STAGES)-th
         * phase of its full barrier. The copy engine wrote them through the async proxy, the proxy
         * wgmma reads through: no fence, and no block barrier. */
        auto next_tile = [&](int j) { mbar_wait(&full[(it0 + j) % STAGES], ((it0 + j) / STAGES) & 1); };
        /* This warp is done with tile j's ring stage: it has waited for every wgmma that read K_j and
         * V_j. One arrival per warp: the last of the NWARPS frees the stage for tile j + STAGES. */
        auto release = [&](int j) {
            if (lane == 0) mbar_arrive(&empty[(it0 + j) % STAGES]);
        };
        /* EARLY_Q: this warp is done with Q_i once it has waited for S_ij of the item's last tile j:
         * only S = Q K^T reads Q_i (P V reads P_ij from registers and V_j; the epilogue, with EARLY_Q,
         * no shared memory), and every warpgroup issues S for every tile of the item, masked or not
         * ("The counts" below), so each warp arrives exactly once per item, NWARPS arrivals a phase.
         * The same release as a ring stage's: the reads were the tensor cores' (async proxy), done
         * at the wait, and the next Q_i is the copy engine's write (async proxy): no proxy fence,
         * the arrival orders them. The producer waits for the phase before the next Q_i; a warp can
         * arrive for the item after only once it has waited for that Q_i (Q_full), so no warp gets
         * a phase ahead. */
        auto release_Q = [&](int j) {
            if constexpr (EARLY_Q)
                if (j == n_tiles - 1 && lane == 0) mbar_arrive(Q_empty);
        };

        /* S_ij = Q_i K_j^T issued (raw: the scale is applied inside the exponential), this
         * warpgroup's 64 rows: one m64nBck16 wgmma per k16 step of the head dim, the first one
         * overwriting S_ij (accumulate = 0), all in one group. S_ij[0]: a warp's one row tile. */
        auto issue_scores = [&](float (&S_ij)[M_TILES][KT][4], int j) {
            const uint64_t K_j = wgmma_desc_step(K_desc, ((it0 + j) % STAGES) * TILE_BYTES);
            wgmma_fence(); /* S_ij's registers were last written by ordinary instructions (tile j-1) */
#pragma unroll
            for (int k = 0; k < HeadDim / 16; k++)
                wgmma_ss<T, Bc, 0>(S_ij[0], wgmma_desc_step(Q_desc, sw128_kmajor_step<Br>(k)),
                                   wgmma_desc_step(K_j, sw128_kmajor_step<Bc>(k)), k > 0);
            wgmma_commit();
        };

        /* O_i += P_ij V_j issued: one m64nDk16 wgmma per k16 step of keys, all in one group */
        auto issue_pv = [&](int j) {
            const uint64_t V_j = wgmma_desc_step(V_desc, ((it0 + j) % STAGES) * TILE_BYTES);
            wgmma_hold(O_acc[0]);
            wgmma_hold(P_ij);
            wgmma_fence(); /* O_acc (rescaled) and P_ij were just written by ordinary instructions */
#pragma unroll
            for (int kb = 0; kb < Bc / 16; kb++)
                wgmma_rs<T, HeadDim, 1>(O_acc[0], P_ij[kb], wgmma_desc_step(V_j, sw128_mnmajor_step(kb)), 1);
            wgmma_commit();
        };

        /* S_ij (in registers; key0 = j Bc, its first key) masked and through the online softmax with
         * the stale max: P_ij in place, as fp32, m_i and l_i updated. Returns whether O_i must be
         * rescaled (the same answer in every lane of the warp), O_i's factors in alpha, not applied:
         * with OVERLAP the tensor cores are still adding P_{i,j-1} V_{j-1} into O_i while this runs. */
        auto softmax = [&](float (&S_ij)[M_TILES][KT][4], int key0, float (&alpha)[M_TILES][2]) {
            /* Masks, only on the tiles that need them: the tail tile (keys past N) and, when causal,
             * the tiles that cross the diagonal (some key after some query of this tile). */
            if (key0 + Bc > N || (causal && key0 + Bc - 1 > q0)) mask_scores(S_ij, key0, q0 + row0, N, causal);

            bool moved[M_TILES][2];
            const bool any = tile_softmax<Tiles::POLY_EVERY>::run(S_ij, m_i, l_i, alpha, moved, scale_log2);
            /* The vote: whether any row of the warp moved, the same answer in every lane. It also
             * reads l_i (l_i < 0 never holds), so that it needs every exponential of the tile: with
             * OVERLAP the wait for P V branches on the vote (below), which keeps the softmax above
             * that wait. */
            const bool rescale = __any_sync(FULL_MASK, any || l_i[0][0] < 0.f || l_i[0][1] < 0.f);
            if constexpr (!OVERLAP)
                if (rescale) scale_rows(O_acc, alpha); /* O_i is ours: rescaled here, by the whole warp or not at all */
            count_moved(tally, moved, q0 + row0, N);
            return rescale;
        };

        /* O_i *= alpha where a row's max moved, then P_ij packed into 16-bit A fragments: two n8 key
         * tiles' C layout is one k16 step's A layout (wgmma.cuh) */
        auto rescale_pack = [&](const float (&S_ij)[M_TILES][KT][4], const float (&alpha)[M_TILES][2], bool rescale) {
            if constexpr (OVERLAP)
                if (rescale) scale_rows(O_acc, alpha);
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
            release_Q(j); /* the item's last S_ij: Q_i read */
            float alpha[M_TILES][2];
            const bool rescale = softmax(S_ij, key0, alpha);
            rescale_pack(S_ij, alpha, rescale);
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
                release_Q(j + 1); /* the item's last S: Q_i read, while P_ij V_j still runs */
                float alpha[M_TILES][2];
                const bool rescale = softmax(S_ij, (j + 1) * Bc, alpha); /* exp2 on the MUFU units, P_ij V_j on the tensor cores */
                /* O_i += P_ij V_j done: O_i is ours again, P_ij's registers free. wgmma_wait_here: a
                 * plain wait ptxas would place above the softmax (wgmma.cuh), leaving it nothing to
                 * overlap. Its branch tests j + rescale (never -1), not j alone, and the vote reads
                 * l_i, the sum of every P of the tile: so the whole softmax is done above the branch,
                 * hence above the wait, by a dependency rather than by ptxas's choice of order (with
                 * the vote on the rows' decisions alone, it sinks every exponential below the wait,
                 * where no P V runs). */
                wgmma_wait_here<0>(j + rescale);
                wgmma_hold(O_acc[0]);
                wgmma_hold(P_ij);
                release(j); /* tile j's stage: K_j read long ago, V_j now */
                rescale_pack(S_ij, alpha, rescale);
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
         * warp's own rows of the Q tile in shared memory, then out in 16-byte stores along each row.
         * EARLY_Q: Q_i may already hold the next item's Q, so O goes from the accumulators straight
         * to global memory, each lane's pairs of adjacent columns as one 32-bit store (a warp's store
         * covers 16 bytes of each of 8 rows; the next n8 tile fills the rest of those 32-byte
         * sectors, which L2 merges before HBM: the same bytes reach HBM). Not through another shared
         * buffer: at d = 128 Q_i and the three ring stages leave 3 KiB, at d = 256 35 KiB, under
         * the 32 and 64 KiB of an O tile; only d = 64 has room, and one epilogue serves every d. */
        if constexpr (!EARLY_Q)
            named_barrier_sync(1 + wg, WARPGROUP); /* a warpgroup's wgmma reads all 64 of its rows of Q_i: no
                                                    * warp overwrites its rows before every warp of its
                                                    * warpgroup is past its last wgmma (a barrier of the
                                                    * warpgroup alone: the producer has left) */
        normalize_rows(O_acc, m_i, l_i, L, q0 + row0, N, scale_log2, tally);
        if constexpr (EARLY_Q) {
#pragma unroll
            for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int query = q0 + row0 + mt * 16 + 8 * h + g;
                    if (query < N) /* rows past N are not written */
#pragma unroll
                        for (int nt = 0; nt < DT; nt++)
                            *(uint32_t *)&O[(size_t)query * HeadDim + nt * 8 + 2 * t] =
                                M::pack(O_acc[mt][nt][2 * h], O_acc[mt][nt][2 * h + 1]);
                }
        } else {
            store_rows_sw128<Br, HeadDim>(O_acc, Q_i, O, q0, row0, N);
            /* This warp's rows of Q_i are free for the next item's Q_i: its lanes' ordinary reads and
             * writes of them (generic proxy) ordered before the copy engine's write (async proxy), then
             * one arrival per warp on Q_empty, which the producer waits for */
            fence_proxy_async_smem();
            __syncwarp();
            if (lane == 0) mbar_arrive(Q_empty);
        }
        it0 += n_tiles;
    }
    if (wg == 0) turn_begin(); /* the turn the last warpgroup handed over, which nobody takes (the counts) */
    tally.flush(counters);
}

/* ---- launcher ---- */

/* The HBM bytes the loop structure moves: Q once; K_j, V_j once per Q tile that sees them; O and L
 * once. (16-bit elements in both dtypes.) */
void hbm_bytes(const struct shape *sh, struct hbm_traffic *t)
{
    const double kv_rows = takes_short_causal(sh) ? kv_rows_read<tiles<short_causal<cfg<64>>>>(sh)
                           : sh->d == 64                ? kv_rows_read<tiles<cfg<64>>>(sh)
                           : sh->d == 128               ? kv_rows_read<tiles<cfg<128>>>(sh)
                                                        : kv_rows_read<tiles<cfg<256>>>(sh);
    const double heads = (double)sh->B * sh->H, d = sh->d, N = sh->N;
    t->Q = heads * N * d * 2;
    t->KV = heads * 2.0 * kv_rows * d * 2;
    t->O = heads * N * d * 2;
    t->O_work = 0;
    t->rowstats = heads * N * sizeof(float); /* L */
    t->q_reads = 1;
}

/* The device's SMs and L2 bytes, asked once per run. Returns 0, or ATTN_CUDA_ERROR (no device). */
struct device_facts {
    int sms, l2_bytes;
};
int device_facts_of(struct device_facts *f, char *why, size_t n)
{
    static struct device_facts known = {0, 0};
    if (!known.sms) {
        int dev = 0;
        CUDA_TRY(cudaGetDevice(&dev));
        CUDA_TRY(cudaDeviceGetAttribute(&known.l2_bytes, cudaDevAttrL2CacheSize, dev));
        CUDA_TRY(cudaDeviceGetAttribute(&known.sms, cudaDevAttrMultiProcessorCount, dev));
    }
    *f = known;
    return 0;
}

/* The heads per section of the work order (the kernel's work_of): as many heads as have their K
 * and V, 2 * N * d 16-bit elements each, in half of `l2_bytes` (the other half for the Q tiles, O
 * and what else passes through), at least 1, at most every head. L2_SECTIONS false (an ablation),
 * or l2_bytes 0 (no device to ask: a summary on a machine without one): one section of every head. */
template <bool L2_SECTIONS>
int section_heads(const struct shape *sh, int l2_bytes)
{
    const long long bh = (long long)sh->B * sh->H, kv_head = 2LL * sh->N * sh->d * 2;
    const long long rule = L2_SECTIONS && l2_bytes ? std::max(1LL, l2_bytes / 2 / kv_head) : bh;
    return (int)std::min(bh, rule);
}

/* The workspace: the counter the blocks take their work items from (the kernel's take_item), zero
 * when allocated (the harness zeroes a workspace once) and zero again after every call. */
size_t workspace_bytes(const struct attn_args *a)
{
    (void)a;
    return sizeof(unsigned);
}

template <typename T, typename Cfg, bool L2_SECTIONS, bool COUNT>
int launch(const struct attn_args *a, char *why, size_t n)
{
    typedef tiles<Cfg> Tiles;
    constexpr int HeadDim = Tiles::HeadDim;
    const size_t smem = Tiles::bytes;
    if (int rc = smem_optin(stage18_exp2_two_pipes_kernel<T, Cfg, COUNT>, smem, HeadDim, why, n)) return rc;

    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    const long long items = bh * CEIL_DIV(sh->N, Tiles::Br); /* (Q tile, head): the kernel's work items */
    if (items > 2147483647LL) {
        snprintf(why, n, "batch * heads * Q tiles = %lld is more work items than the kernel counts (2^31 - 1)", items);
        return ATTN_UNSUPPORTED;
    }
    if (!a->work) {
        snprintf(why, n, "needs its workspace (workspace_bytes: the work items' counter) and none was given");
        return ATTN_UNSUPPORTED;
    }
    struct device_facts dev;
    if (int rc = device_facts_of(&dev, why, n)) return rc;
    /* one block per SM (fewer where there are fewer items): a block needs the whole SM (its
     * registers and most of its shared memory), so these are all the blocks that run at once */
    const long long blocks = std::min(items, (long long)dev.sms);
    const int section = section_heads<L2_SECTIONS>(sh, dev.l2_bytes);
    /* The tensor maps, made on the host for this call's tensors (a few microseconds of CPU, no
     * GPU work) and passed by value: Q's boxes are Br rows, K's and V's Bc. */
    CUtensorMap tmap_Q, tmap_K, tmap_V;
    if (int rc = tma_map_heads<T>(&tmap_Q, (const T *)a->Q, bh, sh->N, HeadDim, Tiles::Br, why, n)) return rc;
    if (int rc = tma_map_heads<T>(&tmap_K, (const T *)a->K, bh, sh->N, HeadDim, Tiles::Bc, why, n)) return rc;
    if (int rc = tma_map_heads<T>(&tmap_V, (const T *)a->V, bh, sh->N, HeadDim, Tiles::Bc, why, n)) return rc;
    /* one dimension: the kernel numbers the items itself, by sections, heaviest first */
    const dim3 grid((unsigned)blocks);
    const dim3 block(Tiles::NTHREADS);
    stage18_exp2_two_pipes_kernel<T, Cfg, COUNT><<<grid, block, smem>>>(
        tmap_Q, tmap_K, tmap_V, (T *)a->O, a->L, sh->N, (int)bh, section, sh->causal, sh->scale * LOG2E,
        (unsigned *)a->work, a->counters);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* dtype, head dim and counting build -> the kernel's template arguments; Cfg<HeadDim> is the
 * configuration of each head dim (the stage's: cfg), L2_SECTIONS the work order's (true: the
 * rule's sections of heads; false, an ablation: one section of every head) */
template <template <int> class Cfg, bool L2_SECTIONS, typename T, bool COUNT>
int dispatch_d(const struct attn_args *a, char *why, size_t n)
{
    if (takes_short_causal(&a->sh)) return launch<T, short_causal<Cfg<64>>, L2_SECTIONS, COUNT>(a, why, n);
    switch (a->sh.d) {
    case 64: return launch<T, Cfg<64>, L2_SECTIONS, COUNT>(a, why, n);
    case 128: return launch<T, Cfg<128>, L2_SECTIONS, COUNT>(a, why, n);
    case 256: return launch<T, Cfg<256>, L2_SECTIONS, COUNT>(a, why, n);
    }
    snprintf(why, n, "supports head dim 64, 128 or 256 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

template <template <int> class Cfg, bool L2_SECTIONS, typename T>
int dispatch(const struct attn_args *a, char *why, size_t n)
{
    return a->counters ? dispatch_d<Cfg, L2_SECTIONS, T, true>(a, why, n) : dispatch_d<Cfg, L2_SECTIONS, T, false>(a, why, n);
}

/* The forward with the configurations Cfg<64>, Cfg<128>, Cfg<256>; the stage's is forward<cfg>. */
template <template <int> class Cfg, bool L2_SECTIONS = true>
int forward(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype == DT_F16) return dispatch<Cfg, L2_SECTIONS, __half>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch<Cfg, L2_SECTIONS, __nv_bfloat16>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

/* What the summary names: the tiles, the schedule, and the sections of heads for this shape. */
template <typename Cfg, bool L2_SECTIONS>
int tiles_of(const struct shape *sh, size_t limit, struct tile_config *c)
{
    typedef tiles<Cfg> Tiles;
    if (Tiles::bytes > limit) {
        snprintf(c->text, sizeof c->text, "d=%d needs %zu.%zu KiB of shared memory per block; this device allows %zu KiB%s",
                 Tiles::HeadDim, Tiles::bytes / 1024, Tiles::bytes % 1024 * 10 / 1024, limit / 1024,
                 smem_cap_words(limit));
        return ATTN_UNSUPPORTED;
    }
    char unused[160];
    struct device_facts dev = {0, 0};
    if (device_facts_of(&dev, unused, sizeof unused)) (void)cudaGetLastError(); /* no device: dev stays 0 */
    return tiles_found(c, Tiles::Br, Tiles::Bc, Tiles::bytes,
                       "Br=%d Bc=%d stages=%d, %d consumer warpgroups, %s, %s, persistent grid%s, L2 sections of %d heads",
                       Tiles::Br, Tiles::Bc, Tiles::STAGES, Tiles::NWARPGROUPS, Tiles::PINGPONG ? "turns" : "no turns",
                       Tiles::OVERLAP ? "softmax under P V" : Tiles::TURNED ? "softmax after P V" : "not turned",
                       Tiles::EARLY_Q ? ", early Q_i" : "", section_heads<L2_SECTIONS>(sh, dev.l2_bytes));
}

template <template <int> class Cfg, bool L2_SECTIONS = true>
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    (void)backward; /* a forward only */
    if (takes_short_causal(&a->sh)) return tiles_of<short_causal<Cfg<64>>, L2_SECTIONS>(&a->sh, limit, c);
    switch (a->sh.d) {
    case 64: return tiles_of<Cfg<64>, L2_SECTIONS>(&a->sh, limit, c);
    case 128: return tiles_of<Cfg<128>, L2_SECTIONS>(&a->sh, limit, c);
    case 256: return tiles_of<Cfg<256>, L2_SECTIONS>(&a->sh, limit, c);
    }
    snprintf(c->text, sizeof c->text, "supports head dim 64, 128 or 256 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

} // namespace

extern "C" const struct stage stage18_desc = {
    .name = "stage18",
    .idea = "Hopper: a share of the softmax's exp2 by a polynomial on the FMA pipe, the rest on MUFU",
    .device = ON_GPU,
    .forward = forward<cfg>,
    .backward = NULL,
    .dims = {64, 128, 256},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = workspace_bytes,
    .openmp = 0,
    .hbm_traffic = hbm_bytes,
    .measures_backward = 0,
    .arch_sm = 90,
    .tiles = tiles_for<cfg>,
};
