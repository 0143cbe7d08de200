/* 19_fp8.cu: the forward in FP8: Q, K and V quantized to e4m3 per block of 64 rows, Q and K
 *   through a random-sign Hadamard transform first, both products on the FP8 wgmma
 *
 * Changed from stage 18:
 *   1. --dtype fp8: Q, K, V arrive in fp16 (the harness's inputs) and the stage's own kernel,
 *      fp8_quantize_kernel (common/cuda/fp8_quant.cuh), turns them into e4m3 with one fp32 scale
 *      per block of FP8_BLOCK_ROWS = 64 rows of a head (max|x| / 448), into the workspace; the
 *      attention kernel then reads one byte an element, and O leaves in fp16.
 *   2. The FP8 wgmma (m64nNk32, wgmma.cuh) takes both operands K-major. S = Q K^T is already so;
 *      for O = P V the keys are the k, so V is stored transposed, V^T [d][keys], by the
 *      quantization kernel, and P, an accumulator, is packed four keys a register straight into
 *      the 8-bit A operand: the accumulator gives each thread keys 2t, 2t + 1 of every n8 tile,
 *      the A operand wants 4t .. 4t + 3 of every 16, so V^T's columns are permuted within each 32
 *      keys to match (key_of_position) instead of moving P between lanes.
 *   3. The scales: S's true value is sq sk S8 (sq per warpgroup's 64 rows, sk per 64 keys: two per
 *      K tile of 128), folded into the exponent's factor, one per half of the tile; V's per-block
 *      scale sv is folded into P before it is rounded to e4m3, as P 256 sv / SV with SV the
 *      largest of the head's (P <= 1 with the exact max below, so 256 P <= 256 < 448 and small P
 *      stay out of e4m3's subnormals), and O is multiplied by SV / 256 once at the end.
 *   4. The exact max (TAU = 0): P <= 1, which the e4m3 range needs (stage 18's P <= 256 would
 *      not leave room for the factor).
 *   5. --hadamard 1 (the default): Q and K multiplied by the same H diag(signs) / sqrt(d), which
 *      cancels in Q K^T and spreads an outlier channel over all d (incoherent processing).
 * Why: Hopper's tensor cores run e4m3 at twice the 16-bit rate; the softmax is the same work.
 * d = 64, 128 and 256 (at d = 64 the rows of Q and K are padded with zeros to 128 bytes, one row
 * of the 128-byte swizzle: S's matmul does twice the work it needs; notes/19_fp8.md counts what
 * that costs).
 * Hopper only: compiled for sm_90a (the Makefile's HOPPER_STAGES); elsewhere it exits 3.
 * The layouts and the error: notes/19_fp8.md.
 * Run: ./stage19 --dtype fp8 --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "common/attn.h"
#include "common/cuda/counters.cuh"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/exp2_poly.cuh"
#include "common/cuda/fp8_quant.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"
#include "common/cuda/softmax.cuh"
#include "common/cuda/tma.cuh"
#include "common/cuda/wgmma.cuh"
#include "common/fp8.h"

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
 *                by MUFU; or one of the floors' values below (bench/ablations only);
 *   EARLY_Q      1: each consumer warp frees Q_i for the next work item's as soon as the item's last
 *                S = Q K^T has completed, not after the epilogue, so that the next Q_i is copied
 *                under the item's last P V, softmax and epilogue instead of before the next item's
 *                first S. The epilogue then cannot stage O through Q_i: it stores O from the
 *                accumulators straight to global memory.
 * Per thread a consumer warpgroup's accumulators hold Bc / 2 fp32 of S_ij and HeadDim / 2 of O_i,
 * and P_ij takes Bc / 8 registers (four e4m3 a register) that the tensor cores read until the
 * wait: all three live at once.
 *
 * The producer warpgroup comes after the consumers, as in stage 18, and gives its registers away
 * (setmaxnreg): 240 registers each for two consumer warpgroups, 160 for three. Every tile is bytes now:
 * a row of Q_i or K_j is max(d, 128) bytes, a row of V_j^T is Bc = 128 keys, one 128-byte swizzle row, the
 * unit a copy and a wgmma descriptor work in (wgmma.cuh: the 8-bit k32 step is the 16-bit k16
 * step's 32 bytes):
 *
 *   d     consumer WGs  Br   Bc   STAGES  TURNED  turns, overlap  consumer registers        Q_i + ring
 *   64    3             192  128  4       1       no, yes         160: O 32 + S 64 + P 16   24 + 4 x 24 = 120 KiB
 *   128   2             128  128  4       1       yes, yes        240: O 64 + S 64 + P 16   16 + 4 x 32 = 144 KiB
 *   256   2             128  128  3       1       no, yes         240: O 128 + S 64 + P 16  32 + 3 x 64 = 224 KiB
 *
 * d = 64:  stage 18's three warpgroups, without the turns; Q_i and K_j rows of 128 bytes (64 of
 *          zeros), V_j^T 64 rows of 128 keys: 16 + 8 KiB a stage.
 * d = 128: stage 18's loop; the ring one stage deeper, since a stage is half the bytes.
 * d = 256: 128 keys a tile, not stage 18's 64: V_j^T's rows are keys, and the 128-byte swizzle
 *          wants 128 of them; the loop turned, with the overlap (stage 18's d = 256 has neither),
 *          and a third stage, since a turned consumer holds two.
 * EARLY_Q everywhere: the epilogue stores O (16-bit) from the accumulators: at d = 128 and 256 Q_i,
 * one byte an element, is half O's 16-bit tile; at d = 64 the padded Q_i would just hold it, but
 * one epilogue serves all three.
 * POLY_EVERY: a sixteenth at d = 128, where stage 18 has none: FP8's matmuls take half fp16's time,
 * so MUFU (1056 clocks a round at d = 128) is now level with the tensor cores (1024), not at half of
 * them; none at 64 (stage 18's eighth measured slower here) and 256.
 * The turns and the shares are measured choices: note 19, "Tried, and why it lost".
 * Short causal problems at d = 64 take two consumer warpgroups, as in stage 18 (short_causal, below). */
/* POLY_EVERY's values for the floors, ablations whose output is wrong on purpose, timed with --no-check:
 * FLOOR_NO_EXP (19_free_exp.cu): no exponential at all, P = |the exponent| (>= 0, so that l_i's vote
 *   never calls for a rescale the stage would not make): what free exponentials would buy;
 * FLOOR_NO_SOFTMAX (19_mm_only.cu): no softmax at all, the scores go into P V as they are: what the
 *   matmuls, the conversions and the pipeline alone take;
 * FLOOR_NO_RESCALE (19_max_exp.cu): the row maxima, every exponential on MUFU and the sums, but O_i
 *   never rescaled: what any online softmax must do. */
constexpr int FLOOR_NO_EXP = -1, FLOOR_NO_SOFTMAX = -2, FLOOR_NO_RESCALE = -3;
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { static constexpr int HeadDim = 64, NWARPGROUPS = 3, Bc = 128, STAGES = 4, TURNED = 1, PINGPONG = 0, OVERLAP = 1, EARLY_Q = 1, POLY_EVERY = 0; };
template <>
struct cfg<128> { static constexpr int HeadDim = 128, NWARPGROUPS = 2, Bc = 128, STAGES = 4, TURNED = 1, PINGPONG = 1, OVERLAP = 1, EARLY_Q = 1, POLY_EVERY = 16; };
template <>
struct cfg<256> { static constexpr int HeadDim = 256, NWARPGROUPS = 2, Bc = 128, STAGES = 3, TURNED = 1, PINGPONG = 0, OVERLAP = 1, EARLY_Q = 1, POLY_EVERY = 0; };
/* Stage 18's rule for short causal problems at d = 64: a Q tile of 192 rows reaches far past the
 * diagonal where a head has few tiles (at N = 1024 the 192-row tiles compute 786k scores for the
 * 525k the mask keeps, tiles of 128 rows 590k), so under the mask and for N <= SHORT_CAUSAL_N the
 * kernel runs with two consumer warpgroups (Br = 128). The waste is counted in scores, the same in
 * FP8 as in fp16. */
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
    /* Q_i [Br][QK], then the ring: STAGES buffers of K_j [Bc][QK], STAGES of V_j^T [HeadDim][Bc],
     * all e4m3 bytes, in the 128-byte swizzle (wgmma.cuh): each starts on a 1024-byte atom. QK,
     * the bytes of a row of Q or K: HeadDim, but at least one swizzle row, 128 (d = 64: channels
     * 64 .. 127 are zeros, written by the quantization, and add nothing to S). Then the
     * mbarriers, 8 bytes each: full[STAGES], empty[STAGES], Q_full, Q_empty; then a slot for the
     * number of the block's next work item, which lands with its Q_i (-1: none, the block is done;
     * the item hand-over in the kernel). */
    static constexpr size_t Q_i = 0;
    static constexpr int QK = HeadDim < 128 ? 128 : HeadDim;
    static constexpr size_t K_TILE = (size_t)Bc * QK, V_TILE = (size_t)HeadDim * Bc; /* one K_j, one V_j^T */
    static constexpr size_t K_j = Q_i + (size_t)Br * QK;
    static constexpr size_t V_j = K_j + STAGES * K_TILE;
    static constexpr size_t full = V_j + STAGES * V_TILE;
    static constexpr size_t empty = full + STAGES * sizeof(uint64_t);
    static constexpr size_t Q_full = empty + STAGES * sizeof(uint64_t);
    static constexpr size_t Q_empty = Q_full + sizeof(uint64_t);
    static constexpr size_t item_slot = Q_empty + sizeof(uint64_t);
    static constexpr size_t bytes = item_slot + sizeof(int);
    static_assert(Br == NWARPGROUPS * 64, "a warpgroup's rows are one wgmma's M, 64");
    static_assert(QK % 128 == 0 && HeadDim % 64 == 0, "the 128-byte swizzle takes rows of whole 128-byte blocks");
    static_assert(Bc == 128, "V_j^T's rows are Bc keys: one 128-byte swizzle row; S_ij's two halves, two K scales");
    static_assert(K_j % SW128_ATOM_BYTES == 0 && V_j % SW128_ATOM_BYTES == 0 && K_TILE % SW128_ATOM_BYTES == 0 &&
                      V_TILE % SW128_ATOM_BYTES == 0,
                  "every tile on a 1024-byte atom");
    static_assert(HeadDim <= 256, "V_j^T's box has HeadDim rows, at most 256");
    static_assert(EARLY_Q, "O leaves from the accumulators: Q_i is freed at the item's last S");
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

/* ---- the softmax of scaled e4m3 scores ---- */

/* log2(x) and 1 / x with one MUFU instruction each (lg2.approx, rcp.approx; flush-to-zero), for a
 * tile's factors (the kernel's `factors`): __log2f and 1.f / x compile to the same MUFU plus a
 * denormal fix-up, and the division to a branch around a call to its slow path, every tile. The
 * factors are 256 sv / SV >= 2^-64 (a block of zeros' scale), far from fp32's denormals, and
 * relative errors of ~2^-22 are nothing beside e4m3's 2^-4. */
__device__ __forceinline__ float log2_approx(float x)
{
    float y;
    asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float rcp_approx(float x)
{
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* One tile of the online softmax with the exact max, on S8 = Q8 K8^T as the tensor cores return it:
 * the true score of key k is sq sk(k) S8, sk one scale per 64 keys, so the row's exponent is
 * S8 c_h - m with c_h = scale log2(e) sq sk_h for the tile's half h (keys 0-63, 64-127), and the
 * running max m_i is kept in those log2 units:
 *   m_new = max(m_i, c_0 rowmax(S8 half 0), c_1 rowmax(S8 half 1))   (c_h > 0)
 *   P     = exp2(S8 c_h - m_new) <= 1;  alpha = exp2(m_i - m_new);  l_i = alpha l_i + rowsum(P)
 * No stale max here (stage 18's TAU): P goes into P V as e4m3 after a factor up to 256, and
 * e4m3's largest value is 448, so P must stay at most 1. A row still all masked keeps m = -inf:
 * its P = exp2(-inf) = 0 and alpha = 1. moved[mt][h]: whether this lane's row's max rose; returns
 * whether any did (the caller's vote rescales O_i or not, for the whole warp).
 * What is left in S is not P but P f_h, the factor P carries into P V (the kernel's factors: f_h
 * <= 256), put into the exponent as + log2(f_h), lf_h: exp2(x + lf_h) = P f_h, one FFMA as before
 * instead of a multiply more per score. l_i sums P itself: each half's sum times 1 / f_h. */
template <int POLY_EVERY, int M_TILES, int KT>
__device__ __forceinline__ bool online_softmax_fp8(float (&S)[M_TILES][KT][4], float (&m_i)[M_TILES][2],
                                                   float (&l_i)[M_TILES][2], float (&alpha)[M_TILES][2],
                                                   bool (&moved)[M_TILES][2], float c0, float c1, float lf0,
                                                   float lf1, float inv_f0, float inv_f1)
{
    bool any = false;
#pragma unroll
    for (int mt = 0; mt < M_TILES; mt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < KT; nt++) {
                const float v = fmaxf(S[mt][nt][2 * h], S[mt][nt][2 * h + 1]);
                if (nt < KT / 2) mx0 = fmaxf(mx0, v);
                else mx1 = fmaxf(mx1, v);
            }
            float mx = fmaxf(m_i[mt][h], fmaxf(mx0 * c0, mx1 * c1));
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1)); /* the quad holds the row */
            mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
            const bool move = mx > m_i[mt][h]; /* false while the row is all masked (-inf > -inf) */
            const float base = mx == -INFINITY ? 0.f : mx;
            alpha[mt][h] = move ? exp2_approx(m_i[mt][h] - base) : 1.f;
            m_i[mt][h] = mx, moved[mt][h] = move, any |= move;
            const float bias0 = lf0 - base, bias1 = lf1 - base;
            float sum0 = 0.f, sum1 = 0.f;
#pragma unroll
            for (int nt = 0; nt < KT; nt++) {
                const float c = nt < KT / 2 ? c0 : c1, bias = nt < KT / 2 ? bias0 : bias1; /* nt: a compile-time constant */
                const float x0 = fmaf(S[mt][nt][2 * h], c, bias);
                const float x1 = fmaf(S[mt][nt][2 * h + 1], c, bias);
                constexpr int EVERY = POLY_EVERY > 0 ? POLY_EVERY : 1;
                const bool poly = POLY_EVERY > 0 && nt % EVERY == EVERY - 1;
                const float p0 = POLY_EVERY == FLOOR_NO_EXP ? fabsf(x0) : poly ? exp2_poly(x0) : exp2_approx(x0);
                const float p1 = POLY_EVERY == FLOOR_NO_EXP ? fabsf(x1) : poly ? exp2_poly(x1) : exp2_approx(x1);
                S[mt][nt][2 * h] = p0, S[mt][nt][2 * h + 1] = p1;
                if (nt < KT / 2) sum0 += p0 + p1;
                else sum1 += p0 + p1;
            }
            l_i[mt][h] = alpha[mt][h] * l_i[mt][h] + (sum0 * inv_f0 + sum1 * inv_f1);
        }
    return any;
}

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
 * the timed build has none. T: O's type (fp16). q_scales, k_scales, v_scales: [BH][NB], one per
 * block of FP8_BLOCK_ROWS rows (keys, for V) of a head, from fp8_quantize_kernel. */
template <typename T, typename Cfg, bool COUNT>
__global__ void __launch_bounds__(tiles<Cfg>::NTHREADS, 1)
stage19_fp8_kernel(const __grid_constant__ CUtensorMap tmap_Q, const __grid_constant__ CUtensorMap tmap_K,
                   const __grid_constant__ CUtensorMap tmap_V, const float *__restrict__ q_scales,
                   const float *__restrict__ k_scales, const float *__restrict__ v_scales, int NB, T *__restrict__ O_all,
                   float *__restrict__ L_all, int N, int BH, int section, int causal, float scale_log2,
                   unsigned *__restrict__ next_item, unsigned long long *counters)
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
    uint8_t *Q_i = smem + Tiles::Q_i;
    uint8_t *K_buf = smem + Tiles::K_j; /* [STAGES][Bc][QK] */
    uint8_t *V_buf = smem + Tiles::V_j; /* [STAGES][HeadDim][Bc]: V_j^T */
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
    /* the matrix descriptors (wgmma.cuh), each at its operand's first k32 step; the others are
     * compile-time steps from them: all three K-major, as the 8-bit wgmma needs: Q_i and K_j
     * (rows contiguous along d), V_j^T (rows contiguous along the keys, P_ij V_j's k) */
    const uint64_t Q_desc = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(Q_i) + wg * 64 * SW128_ROW_BYTES);
    const uint64_t K_desc = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(K_buf));
    const uint64_t V_desc = wgmma_desc_kmajor((unsigned)__cvta_generic_to_shared(V_buf));
    constexpr unsigned K_TILE = Tiles::K_TILE, V_TILE = Tiles::V_TILE, QK = Tiles::QK; /* a K_j, a V_j^T buffer; Q's and K's row */

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
                    mbar_arrive_expect_tx(&full[s], K_TILE + V_TILE); /* K_j and V_j^T: the phase ends when both land */
                    for (int cb = 0; cb < QK / 128; cb++) /* K_j: a box per 128 columns */
                        tma_load_3d(K_buf + s * K_TILE + cb * Bc * 128, &tmap_K, &full[s], cb * 128, j * Bc, W.bh);
                    /* V_j^T: one box, its HeadDim rows by the tile's 128 keys */
                    tma_load_3d(V_buf + s * V_TILE, &tmap_V, &full[s], j * Bc, 0, W.bh);
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
                /* the item's number, then Q_i: QK / 128 boxes of 128 columns x Br rows, one per
                 * column block */
                if (issuer) {
                    atomicExch(item_slot, w); /* before the arrival that releases it */
                    mbar_arrive_expect_tx(Q_full, Br * QK);
                    for (int cb = 0; cb < QK / 128; cb++)
                        tma_load_3d(Q_i + cb * Br * 128, &tmap_Q, Q_full, cb * 128, W.q0, W.bh);
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
         * max of the scores in log2 units (scale log2(e) times the true score); l_i is this lane's
         * part of the row sum (its 2 of every 8 columns), added across the quad only at the end.
         * P_ij is the A operand of O_i += P_ij V_j, four e4m3 a register (wgmma.cuh's 8-bit A
         * layout: per k32 step, rows g and g + 8, keys 4t .. 4t + 3 and 16 + 4t .. of V_j^T's
         * permuted order). */
        float O_acc[M_TILES][DT][4] = {};
        float m_i[M_TILES][2], l_i[M_TILES][2];
#pragma unroll
        for (int mt = 0; mt < M_TILES; mt++) m_i[mt][0] = m_i[mt][1] = -INFINITY, l_i[mt][0] = l_i[mt][1] = 0.f;
        uint32_t P_ij[Bc / 32][4];

        /* The scales (fp8_quantize_kernel's, one per 64 rows of a head): sq, this warpgroup's 64
         * rows of Q_i; SV, the largest V scale of the head, which P carries (below): each warp
         * reads the head's blocks that hold keys (a block wholly past N, padding, is left out), a
         * lane every 32nd, and takes their max. */
        const float *qs = q_scales + (size_t)W.bh * NB, *ks = k_scales + (size_t)W.bh * NB, *vs = v_scales + (size_t)W.bh * NB;
        /* (a Q tile of 192 rows, d = 64, may end past Npad: its last warpgroup's rows are then all
         * past N, zeros, and it reads the head's last scale instead) */
        const float sq = __ldg(qs + min(q0 / FP8_BLOCK_ROWS + wg, NB - 1));
        float SV = 0.f;
        for (int b = lane; b < CEIL_DIV(N, FP8_BLOCK_ROWS); b += WARP_SIZE) SV = fmaxf(SV, __ldg(vs + b));
#pragma unroll
        for (int m = 16; m > 0; m /= 2) SV = fmaxf(SV, __shfl_xor_sync(FULL_MASK, SV, m));
        /* Tile j's scales, two of K and two of V (its halves of 64 keys), and its factors: the
         * exponent's c_h = scale log2(e) sq sk_h, and P's f_h = 256 sv_h / SV, so that
         * P V8 f_h SV / 256 = P (sv_h V8), the true P V. The turned loop loads a tile's scales one
         * tile before it needs them: loaded in the same turn, their latency sat inside the turn
         * (ptxas hoists the arithmetic on them above the bar.arrive that ends it), where the other
         * warpgroup waits on it too. A j past the item's tiles loads its last tile's again. */
        struct tile_scales { float k0, k1, v0, v1; };
        struct tile_factors { float c0, c1, lf0, lf1, inv_f0, inv_f1; };
        auto load_scales = [&](int j) {
            j = min(j, n_tiles - 1);
            return tile_scales{__ldg(ks + 2 * j), __ldg(ks + 2 * j + 1), __ldg(vs + 2 * j), __ldg(vs + 2 * j + 1)};
        };
        auto factors = [&](const tile_scales &t) {
            const float c = scale_log2 * sq, f0 = 256.f / SV * t.v0, f1 = 256.f / SV * t.v1;
            return tile_factors{c * t.k0, c * t.k1, log2_approx(f0), log2_approx(f1), rcp_approx(f0), rcp_approx(f1)};
        };

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

        /* S_ij = Q_i K_j^T issued (e4m3 products, unscaled: the scales are applied inside the
         * exponential), this warpgroup's 64 rows: one m64nBck32 wgmma per k32 step of the head dim,
         * the first one overwriting S_ij (accumulate = 0), all in one group. S_ij[0]: a warp's one
         * row tile. */
        auto issue_scores = [&](float (&S_ij)[M_TILES][KT][4], int j) {
            const uint64_t K_j = wgmma_desc_step(K_desc, ((it0 + j) % STAGES) * K_TILE);
            wgmma_fence(); /* S_ij's registers were last written by ordinary instructions (tile j-1) */
#pragma unroll
            for (int k = 0; k < QK / 32; k++)
                wgmma_ss_e4m3<Bc>(S_ij[0], wgmma_desc_step(Q_desc, sw128_kmajor_step<Br>(k)),
                                  wgmma_desc_step(K_j, sw128_kmajor_step<Bc>(k)), k > 0);
            wgmma_commit();
        };

        /* O_i += P_ij V_j issued: one m64nDk32 wgmma per k32 step of keys (32 bytes of each row of
         * V_j^T), all in one group */
        auto issue_pv = [&](int j) {
            const uint64_t V_j = wgmma_desc_step(V_desc, ((it0 + j) % STAGES) * V_TILE);
            wgmma_hold(O_acc[0]);
            wgmma_hold(P_ij);
            wgmma_fence(); /* O_acc (rescaled) and P_ij were just written by ordinary instructions */
#pragma unroll
            for (int kb = 0; kb < Bc / 32; kb++)
                wgmma_rs_e4m3<HeadDim>(O_acc[0], P_ij[kb], wgmma_desc_step(V_j, sw128_kmajor_step<HeadDim>(kb)), 1);
            wgmma_commit();
        };

        /* S_ij (in registers; key0 = j Bc, its first key) masked and through the online softmax with
         * the exact max: P_ij in place, as fp32, m_i and l_i updated. Returns whether O_i must be
         * rescaled (the same answer in every lane of the warp), O_i's factors in alpha, not applied:
         * with OVERLAP the tensor cores are still adding P_{i,j-1} V_{j-1} into O_i while this runs. */
        auto softmax = [&](float (&S_ij)[M_TILES][KT][4], int key0, const tile_factors &tf, float (&alpha)[M_TILES][2]) {
            /* Masks, only on the tiles that need them: the tail tile (keys past N) and, when causal,
             * the tiles that cross the diagonal (some key after some query of this tile). */
            if (key0 + Bc > N || (causal && key0 + Bc - 1 > q0)) mask_scores(S_ij, key0, q0 + row0, N, causal);

            bool moved[M_TILES][2] = {};
            bool any = false;
            if constexpr (Tiles::POLY_EVERY == FLOOR_NO_SOFTMAX)
                for (int h = 0; h < 2; h++) alpha[0][h] = 1.f;
            else
                any = online_softmax_fp8<Tiles::POLY_EVERY>(S_ij, m_i, l_i, alpha, moved, tf.c0, tf.c1, tf.lf0, tf.lf1,
                                                            tf.inv_f0, tf.inv_f1);
            /* The vote: whether any row of the warp moved, the same answer in every lane. It also
             * reads l_i (l_i < 0 never holds), so that it needs every exponential of the tile: with
             * OVERLAP the wait for P V branches on the vote (below), which keeps the softmax above
             * that wait. */
            const bool rescale = __any_sync(FULL_MASK, (Tiles::POLY_EVERY != FLOOR_NO_RESCALE && any) || l_i[0][0] < 0.f || l_i[0][1] < 0.f);
            if constexpr (!OVERLAP)
                if (rescale) scale_rows(O_acc, alpha); /* O_i is ours: rescaled here, by the whole warp or not at all */
            count_moved(tally, moved, q0 + row0, N);
            return rescale;
        };

        /* O_i *= alpha where a row's max moved, then P_ij f_h (S_ij's values) packed into the 8-bit A fragments,
         * each thread its own values (no shuffle): for k32 step kb, n8 tiles 4kb .. 4kb + 3, register
         * 0 row g (C elements 0, 1 of tiles 4kb, 4kb + 1: keys 2t, 2t + 1, 8 + 2t, 9 + 2t), register
         * 1 the same keys of row g + 8 (elements 2, 3), registers 2, 3 the next 16 keys. Those are
         * positions 4t .. 4t + 3 (16 + 4t .. for 2, 3) of the 8-bit layout, and V_j^T holds key
         * key_of_position(p) at position p (fp8_quant.cuh): the products pair the right keys. */
        auto rescale_pack = [&](const float (&S_ij)[M_TILES][KT][4], const float (&alpha)[M_TILES][2], bool rescale) {
            if constexpr (OVERLAP)
                if (rescale) scale_rows(O_acc, alpha);
#pragma unroll
            for (int kb = 0; kb < Bc / 32; kb++) { /* S_ij holds P f_h already (online_softmax_fp8) */
                const float(&a)[4] = S_ij[0][4 * kb], (&b)[4] = S_ij[0][4 * kb + 1];
                const float(&c)[4] = S_ij[0][4 * kb + 2], (&e)[4] = S_ij[0][4 * kb + 3];
                P_ij[kb][0] = pack_e4m3x4(a[0], a[1], b[0], b[1]);
                P_ij[kb][1] = pack_e4m3x4(a[2], a[3], b[2], b[3]);
                P_ij[kb][2] = pack_e4m3x4(c[0], c[1], e[0], e[1]);
                P_ij[kb][3] = pack_e4m3x4(c[2], c[3], e[2], e[3]);
            }
        };

        /* Tile j's scores, not overlapped: S_ij issued (after O_i += P_{i,j-1} V_{j-1} when turned: the
         * tensor cores take this group right after it), the turn given away, and one wait for both;
         * then the softmax, O_i rescaled, P_ij packed. */
        auto scores = [&](int j, const tile_scales &sc) {
            const int key0 = j * Bc; /* first key of this tile */
            float S_ij[M_TILES][KT][4];
            issue_scores(S_ij, j);
            turn_end(); /* this turn's wgmma are issued: the tensor cores are the next warpgroup's */
            const tile_factors tf = factors(sc);
            wgmma_wait<0>(); /* S_ij in registers (and O_i += P_{i,j-1} V_{j-1} done) */
            wgmma_hold(S_ij[0]);
            wgmma_hold(O_acc[0]);
            wgmma_hold(P_ij);
            if (TURNED && j > 0) release(j - 1); /* O_i += P_{i,j-1} V_{j-1} has read V_{j-1} */
            release_Q(j); /* the item's last S_ij: Q_i read */
            float alpha[M_TILES][2];
            const bool rescale = softmax(S_ij, key0, tf, alpha);
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
        const tile_scales sc0 = load_scales(0); /* loaded before the waits below */
        next_tile(0);
        turn_begin();
        scores(0, sc0);
        if constexpr (OVERLAP) {
            tile_scales sc = load_scales(1); /* tile j + 1's scales at the top of iteration j */
            for (int j = 0; j + 1 < n_tiles; j++) {
                next_tile(j + 1);
                turn_begin(); /* S_{i,j+1} and P_ij V_j go to the tensor cores in this turn */
                float S_ij[M_TILES][KT][4]; /* S_{i,j+1} */
                issue_scores(S_ij, j + 1); /* first: the group the softmax waits for */
                issue_pv(j);               /* second: left running under the softmax */
                turn_end();
                const tile_factors tf = factors(sc); /* tile j + 1's, loaded an iteration ago */
                sc = load_scales(j + 2);             /* tile j + 2's, for the next */
                wgmma_wait<1>(); /* S_{i,j+1} in registers; O_i += P_ij V_j may still be running */
                wgmma_hold(S_ij[0]);
                release_Q(j + 1); /* the item's last S: Q_i read, while P_ij V_j still runs */
                float alpha[M_TILES][2];
                const bool rescale = softmax(S_ij, (j + 1) * Bc, tf, alpha); /* exp2 on the MUFU units, P_ij V_j on the tensor cores */
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
                    scores(j + 1, load_scales(j + 1));
                }
            }
        }
        wgmma_wait<0>(); /* the last O_i += P_ij V_j */
        wgmma_hold(O_acc[0]);
        if constexpr (TURNED) release(n_tiles - 1); /* (no copy waits for it: released all the same,
                                                      * so that every tile is released once) */

        /* The one normalization: O_i times SV / 256 (what P carried, above), over l_i, and L =
         * m + log(l) in nats (m_i is already in log2 units: normalize_rows' factor is 1). O goes
         * from the accumulators straight to global memory, each lane's pairs of adjacent columns as
         * one 32-bit store of two fp16 (a warp's store covers 16 bytes of each of 8 rows; the next
         * n8 tile fills the rest of those 32-byte sectors, which L2 merges before HBM). */
        {
            const float carry = SV * (1.f / 256.f);
#pragma unroll
            for (int nt = 0; nt < DT; nt++)
#pragma unroll
                for (int c = 0; c < 4; c++) O_acc[0][nt][c] *= carry;
        }
        normalize_rows(O_acc, m_i, l_i, L, q0 + row0, N, 1.f, tally);
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
        it0 += n_tiles;
    }
    if (wg == 0) turn_begin(); /* the turn the last warpgroup handed over, which nobody takes (the counts) */
    tally.flush(counters);
}

/* ---- launcher ---- */

/* The HBM bytes the loop structure moves: the quantization reads Q, K, V in fp16 and writes them as
 * bytes (counted with the inputs); the attention reads Q8 once, K8 and V8^T once per Q tile that
 * sees them, writes O in fp16 and L. */
void hbm_bytes(const struct shape *sh, struct hbm_traffic *t)
{
    const double kv_rows = takes_short_causal(sh) ? kv_rows_read<tiles<short_causal<cfg<64>>>>(sh)
                           : sh->d == 64          ? kv_rows_read<tiles<cfg<64>>>(sh)
                           : sh->d == 128         ? kv_rows_read<tiles<cfg<128>>>(sh)
                                                  : kv_rows_read<tiles<cfg<256>>>(sh);
    const double heads = (double)sh->B * sh->H, d = sh->d, N = sh->N, qk = std::max(sh->d, 128); /* Q8's, K8's row */
    t->Q = heads * N * (d * 2 + qk + qk);
    t->KV = heads * N * (2 * d * 2 + qk + d) + heads * kv_rows * (qk + d);
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

/* The heads per section of the work order (the kernel's work_of): as many heads as have their K8
 * and V8^T, N (max(d, 128) + d) bytes each now, in half of `l2_bytes`, at least 1, at most every
 * head. */
int section_heads(const struct shape *sh, int l2_bytes)
{
    const long long bh = (long long)sh->B * sh->H, kv_head = (long long)sh->N * (std::max(sh->d, 128) + sh->d);
    const long long rule = l2_bytes ? std::max(1LL, l2_bytes / 2 / kv_head) : bh;
    return (int)std::min(bh, rule);
}

/* The workspace, 256-byte aligned pieces: the work items' counter (zero when allocated, zero again
 * after every call); then Q8 and K8 [B H][Npad][QK], V8^T [B H][d][Npad] (e4m3), and the three
 * scale arrays [B H][Npad / 64], with Npad = N rounded up to 128 rows and QK = max(d, 128) bytes
 * a row (the quantization writes zeros past N and past d, so a tile never reads another head's
 * rows). */
constexpr int FP8_PAD = 128;
struct fp8_workspace {
    unsigned *counter = nullptr;
    uint8_t *Q8 = nullptr, *K8 = nullptr, *V8t = nullptr;
    float *qs = nullptr, *ks = nullptr, *vs = nullptr;
    int Npad, NB;
    size_t bytes; /* the whole workspace */
    fp8_workspace(const struct shape *sh, void *work)
    {
        Npad = CEIL_DIV(sh->N, FP8_PAD) * FP8_PAD, NB = Npad / FP8_BLOCK_ROWS;
        const size_t bh = (size_t)sh->B * sh->H;
        const size_t qk = (bh * Npad * std::max(sh->d, 128) + 255) / 256 * 256, v = (bh * Npad * sh->d + 255) / 256 * 256;
        const size_t scales = (bh * NB * sizeof(float) + 255) / 256 * 256;
        const size_t at[7] = {0, 256, 256 + qk, 256 + 2 * qk, 256 + 2 * qk + v, 256 + 2 * qk + v + scales,
                              256 + 2 * qk + v + 2 * scales};
        bytes = at[6] + scales;
        if (!work) return;
        char *p = (char *)work;
        counter = (unsigned *)(p + at[0]);
        Q8 = (uint8_t *)(p + at[1]), K8 = (uint8_t *)(p + at[2]), V8t = (uint8_t *)(p + at[3]);
        qs = (float *)(p + at[4]), ks = (float *)(p + at[5]), vs = (float *)(p + at[6]);
    }
};

size_t workspace_bytes(const struct attn_args *a)
{
    return fp8_workspace(&a->sh, NULL).bytes;
}

/* The quantization (fp8_quant.cuh), three launches: Q and K through the Hadamard transform when
 * a->hadamard, into rows of QK bytes; V transposed and permuted; a block of QUANT_THREADS per 64
 * rows of a head. */
constexpr int QUANT_THREADS = 256;
template <typename Cfg, bool HADAMARD>
int quantize(const struct attn_args *a, const fp8_workspace &w, const hadamard_sign_bits &signs)
{
    constexpr int HeadDim = Cfg::HeadDim, QK = tiles<Cfg>::QK;
    const struct shape *sh = &a->sh;
    const dim3 grid((unsigned)w.NB, (unsigned)(sh->B * sh->H));
    fp8_quantize_kernel<HeadDim, FP8_BLOCK_ROWS, HADAMARD, false, QUANT_THREADS, QK>
        <<<grid, QUANT_THREADS>>>((const __half *)a->Q, w.Q8, w.qs, sh->N, w.Npad, signs);
    fp8_quantize_kernel<HeadDim, FP8_BLOCK_ROWS, HADAMARD, false, QUANT_THREADS, QK>
        <<<grid, QUANT_THREADS>>>((const __half *)a->K, w.K8, w.ks, sh->N, w.Npad, signs);
    fp8_quantize_kernel<HeadDim, FP8_BLOCK_ROWS, false, true, QUANT_THREADS>
        <<<grid, QUANT_THREADS>>>((const __half *)a->V, w.V8t, w.vs, sh->N, w.Npad, signs);
    return 0;
}

/* ATTEND false (bench/ablations/19_quant_only.cu): the quantization alone, so that its time can be
 * read apart from the whole forward's */
template <typename Cfg, bool COUNT, bool ATTEND>
int launch(const struct attn_args *a, char *why, size_t n)
{
    typedef tiles<Cfg> Tiles;
    typedef __half T; /* O's type */
    constexpr int HeadDim = Tiles::HeadDim;
    const size_t smem = Tiles::bytes;
    if (int rc = smem_optin(stage19_fp8_kernel<T, Cfg, COUNT>, smem, HeadDim, why, n)) return rc;

    const struct shape *sh = &a->sh;
    const long long bh = (long long)sh->B * sh->H;
    const long long items = bh * CEIL_DIV(sh->N, Tiles::Br); /* (Q tile, head): the kernel's work items */
    if (bh > 65535) {
        snprintf(why, n, "batch * heads = %lld: the quantization's grid takes at most 65535 heads", bh);
        return ATTN_UNSUPPORTED;
    }
    if (items > 2147483647LL) {
        snprintf(why, n, "batch * heads * Q tiles = %lld is more work items than the kernel counts (2^31 - 1)", items);
        return ATTN_UNSUPPORTED;
    }
    if (!a->work) {
        snprintf(why, n, "needs its workspace (workspace_bytes: e4m3 Q, K, V^T, their scales) and none was given");
        return ATTN_UNSUPPORTED;
    }
    const fp8_workspace w(sh, a->work);
    int8_t sign8[256];
    hadamard_signs(sign8, HeadDim, FP8_HADAMARD_SEED);
    hadamard_sign_bits signs = {};
    for (int c = 0; c < HeadDim; c++)
        if (sign8[c] < 0) signs.bits[c >> 5] |= 1u << (c & 31);
    if (a->hadamard) quantize<Cfg, true>(a, w, signs);
    else quantize<Cfg, false>(a, w, signs);
    CUDA_TRY(cudaGetLastError());
    if (!ATTEND) return 0;

    struct device_facts dev;
    if (int rc = device_facts_of(&dev, why, n)) return rc;
    const long long blocks = std::min(items, (long long)dev.sms);
    const int section = section_heads(sh, dev.l2_bytes);
    /* The tensor maps of the workspace's byte tensors: Q8's boxes Br rows, K8's Bc, V8^T's HeadDim
     * rows (the dims) by 128 keys */
    CUtensorMap tmap_Q, tmap_K, tmap_V;
    if (int rc = tma_map_bytes(&tmap_Q, w.Q8, bh, w.Npad, Tiles::QK, Tiles::Br, why, n)) return rc;
    if (int rc = tma_map_bytes(&tmap_K, w.K8, bh, w.Npad, Tiles::QK, Tiles::Bc, why, n)) return rc;
    if (int rc = tma_map_bytes(&tmap_V, w.V8t, bh, HeadDim, w.Npad, HeadDim, why, n)) return rc;
    stage19_fp8_kernel<T, Cfg, COUNT><<<dim3((unsigned)blocks), dim3(Tiles::NTHREADS), smem>>>(
        tmap_Q, tmap_K, tmap_V, w.qs, w.ks, w.vs, w.NB, (T *)a->O, a->L, sh->N, (int)bh, section, sh->causal,
        sh->scale * LOG2E, w.counter, a->counters);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

/* head dim and counting build -> the kernel's template arguments; Cfg<HeadDim> is the configuration
 * of each head dim (the stage's: cfg; an ablation may pass its own) */
template <template <int> class Cfg, bool COUNT, bool ATTEND>
int dispatch_d(const struct attn_args *a, char *why, size_t n)
{
    switch (a->sh.d) {
    case 64:
        if (takes_short_causal(&a->sh)) return launch<short_causal<Cfg<64>>, COUNT, ATTEND>(a, why, n);
        return launch<Cfg<64>, COUNT, ATTEND>(a, why, n);
    case 128: return launch<Cfg<128>, COUNT, ATTEND>(a, why, n);
    case 256: return launch<Cfg<256>, COUNT, ATTEND>(a, why, n);
    }
    snprintf(why, n, "supports head dim 64, 128 or 256 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

template <template <int> class Cfg, bool ATTEND = true>
int forward(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype != DT_FP8) {
        snprintf(why, n, "supports fp8 only (got %s): the 16-bit forward is stage 18's", dtype_name(a->dtype));
        return ATTN_UNSUPPORTED;
    }
    return a->counters ? dispatch_d<Cfg, true, ATTEND>(a, why, n) : dispatch_d<Cfg, false, ATTEND>(a, why, n);
}

/* What the summary names: the tiles, the schedule, and the sections of heads for this shape. */
template <typename Cfg>
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
                       "e4m3, scales per 64 rows, Br=%d Bc=%d stages=%d, %d consumer warpgroups, %s, %s, persistent grid, L2 sections of %d heads",
                       Tiles::Br, Tiles::Bc, Tiles::STAGES, Tiles::NWARPGROUPS, Tiles::PINGPONG ? "turns" : "no turns",
                       Tiles::OVERLAP ? "softmax under P V" : Tiles::TURNED ? "softmax after P V" : "not turned",
                       section_heads(sh, dev.l2_bytes));
}

template <template <int> class Cfg>
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    (void)backward; /* a forward only */
    switch (a->sh.d) {
    case 64:
        if (takes_short_causal(&a->sh)) return tiles_of<short_causal<Cfg<64>>>(&a->sh, limit, c);
        return tiles_of<Cfg<64>>(&a->sh, limit, c);
    case 128: return tiles_of<Cfg<128>>(&a->sh, limit, c);
    case 256: return tiles_of<Cfg<256>>(&a->sh, limit, c);
    }
    snprintf(c->text, sizeof c->text, "supports head dim 64, 128 or 256 (got d=%d)", a->sh.d);
    return ATTN_UNSUPPORTED;
}

} // namespace

extern "C" const struct stage stage19_desc = {
    .name = "stage19",
    .idea = "Hopper, FP8: e4m3 Q, K, V quantized per 64 rows (Q, K through a random-sign Hadamard), V^T for the 8-bit wgmma, P packed in registers",
    .device = ON_GPU,
    .forward = forward<cfg>,
    .backward = NULL,
    .dims = {64, 128, 256},
    .dtypes = DT_FP8,
    .workspace_bytes = workspace_bytes,
    .openmp = 0,
    .hbm_traffic = hbm_bytes,
    .measures_backward = 0,
    .arch_sm = 90,
    .tiles = tiles_for<cfg>,
};
