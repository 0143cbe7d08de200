/* 07_warp_partition.cu: FlashAttention forward with the Q tile split across warps (FA-2 paper, section 3.3)
 *
 * Changed from stage 6: each warp owns 16 rows of the Q tile end to end ("split Q") instead of 16
 *   keys of the K/V tile ("sliced K"). A warp computes all Bc scores of its rows, so the row max,
 *   the row sum, m_i, l_i and its rows of O_i live in that warp's registers: no partial results
 *   meet in shared memory, no per-row factors pass between threads, and the only barriers are the
 *   two that hand K_j and V_j from the loads to the warps. P_ij goes from the S_ij accumulators to
 *   fp16 A fragments in registers and straight into the P_ij V_j mma. With shared memory holding
 *   only Q_i, K_j and V_j, the Q tile grows to eight warps' worth: Br = 128.
 * Why: in stage 6 every K/V step writes four partial Br x d products to shared memory, reads them
 *   back and passes four barriers; the warps wait on each other and on shared memory instead of
 *   issuing mma. And each step waits on its K/V loads for about the same time whatever its size,
 *   so a four times larger Q tile gets four times the work done per wait (and reads K and V from
 *   HBM a quarter as often).
 * Measured on H200: see notes/07_warp_partition.md.
 * Run: ./stage7 --seqlen 4096 --dim 64 --causal --counters
 */
#include "common/attn.h"
#include "common/cuda/counters.cuh"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/mma.cuh"

#include <cuda_fp16.h>
#include <math.h>
#include <stdio.h>

namespace {

/* ---- configuration ---- */

/* Eight warps per block. With split Q each warp owns ROWS_PER_WARP = 16 rows of Q_i, one m16 tile
 * of the mma, so Br = 128; K/V tiles of Bc = 64 keys (32 where shared memory is short: tiles
 * below). Per thread that is 16 x HeadDim / 32 fp32 of O_i (64 registers at HeadDim = 128) and
 * 16 x Bc / 32 of S_ij (32): well inside the 255 a thread may use. The shared memory is Q_i, K_j,
 * V_j alone: 68 KiB at HeadDim = 128 (stage 6 needed 112 KiB for a Q tile of 32). */
constexpr int NWARPS = 8;
constexpr int NTHREADS = NWARPS * WARP_SIZE;
constexpr int ROWS_PER_WARP = 16;                 /* one m16 tile of the mma */
constexpr int Br = NWARPS * ROWS_PER_WARP;        /* 128 query rows per Q tile */

/* Shared-memory row padding against bank conflicts: a row of HeadDim halves is a multiple of 128
 * bytes, so the 8 rows one ldmatrix reads would all start in the same bank. +8 halves (16 bytes)
 * moves each row 4 banks on: the 8 rows cover all 32 banks, and rows stay 16-byte aligned for
 * cp.async and ldmatrix. */
constexpr int HALF_PAD = 8;

/* One configuration, and its dynamic shared memory computed from the tile sizes (byte offsets,
 * then the total): only the three input tiles now. */
template <int HeadDim_, int Bc_>
struct tiles {
    static constexpr int HeadDim = HeadDim_, Bc = Bc_;             /* Bc: keys per K/V tile */
    static constexpr int LDH = HeadDim + HALF_PAD;   /* row stride of K_j, V_j, Q_i (halves) */
    static constexpr size_t K_j = 0;                                               /* [Bc][LDH] fp16 */
    static constexpr size_t V_j = K_j + sizeof(__half) * Bc * LDH;                 /* [Bc][LDH] fp16 */
    static constexpr size_t Q_i = V_j + sizeof(__half) * Bc * LDH;                 /* [Br][LDH] fp16 */
    static constexpr size_t smem_bytes = Q_i + sizeof(__half) * Br * LDH;
    static_assert(HeadDim % 16 == 0, "head dim must be whole k16 steps");
    static_assert(Bc % 16 == 0, "K_j must be whole k16 steps of the P_ij V_j product");
};

/* Per head dim, fastest first (launch takes the first that fits the device's shared memory,
 * common/cuda/launch.cuh). d = 64 fits every GPU (36 KiB); at d = 128 a GPU that allows 64 KiB per
 * block (Turing) takes K/V tiles of 32 keys, which keeps the eight warps and the Q tile. */
template <int HeadDim>
struct cfg;
template <>
struct cfg<64> { typedef config_list<tiles<64, 64>> list; };    /* 36 KiB */
template <>
struct cfg<128> { typedef config_list<tiles<128, 64>,           /* 68 KiB */
                                      tiles<128, 32>> list; };  /* 51 KiB */

/* Calls f(Tiles{}) with the first configuration of head dim d that fits `limit` bytes. */
template <class F>
int with_tiles(int d, size_t limit, char *why, size_t n, F &&f)
{
    switch (d) {
    case 64: return first_fit(cfg<64>::list(), limit, d, why, n, f);
    case 128: return first_fit(cfg<128>::list(), limit, d, why, n, f);
    }
    snprintf(why, n, "supports head dim 64 or 128 (got d=%d)", d);
    return ATTN_UNSUPPORTED;
}

/* ---- kernel ---- */

/* Rows row0 .. row0+ROWS-1 of one head's [N, HeadDim] fp16 matrix into a shared tile with row stride
 * LDH, 16 bytes per cp.async. Rows at or past N are zero-filled (and never read from HBM). */
template <int HeadDim, int ROWS>
__device__ __forceinline__ void load_tile(__half *tile, const __half *src, int row0, int N)
{
    constexpr int LDH = HeadDim + HALF_PAD;
    constexpr int CHUNKS = HeadDim / 8; /* 16-byte pieces per row */
    for (int c = threadIdx.x; c < ROWS * CHUNKS; c += NTHREADS) {
        const int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        const bool valid = row0 + r < N;
        const __half *from = src + (size_t)(valid ? row0 + r : 0) * HeadDim + col;
        cp_async_16_zfill(tile + r * LDH + col, from, valid);
    }
}

/* COUNT: the counting build for --counters (common/cuda/counters.cuh); the timed build has none. */
template <class Tiles, bool COUNT>
__global__ void __launch_bounds__(NTHREADS)
stage7_split_q_kernel(const __half *__restrict__ Q, const __half *__restrict__ K, const __half *__restrict__ V,
                      __half *__restrict__ O, float *__restrict__ L, int N, int causal, float scale_log2,
                      unsigned long long *counters)
{
    typedef Tiles SM;
    constexpr int HeadDim = SM::HeadDim, Bc = SM::Bc, LDH = SM::LDH;
    constexpr int KT = Bc / 8;   /* n8 key tiles of S_ij */
    constexpr int DT = HeadDim / 8;    /* n8 column tiles of O_i */
    extern __shared__ __align__(16) unsigned char smem[];
    __half *K_j = (__half *)(smem + SM::K_j);
    __half *V_j = (__half *)(smem + SM::V_j);
    __half *Q_i = (__half *)(smem + SM::Q_i);

    const int tid = threadIdx.x, warp = tid / WARP_SIZE, lane = tid % WARP_SIZE;
    const int g = lane >> 2, t = lane & 3;          /* groupID, tid_in_group (see mma.cuh) */
    const int row0 = warp * ROWS_PER_WARP;          /* this warp's rows of Q_i, O_i */

    /* One block per (batch, head): move every pointer to this head. */
    const size_t bh = blockIdx.x, head = bh * N * HeadDim;
    Q += head, K += head, V += head, O += head, L += bh * N;

    const int Tr = CEIL_DIV(N, Br), Tc = CEIL_DIV(N, Bc);
    work_tally<COUNT> tally;

    for (int i = 0; i < Tr; i++) {
        const int j_last = causal ? min(Tc - 1, ((i + 1) * Br - 1) / Bc) : Tc - 1; /* causal: K/V tiles wholly
                                                                                     * right of the diagonal skipped */
        /* Q_i: HBM -> shared memory once, read by every inner step: its only load; and the first
         * K_j of the sweep (V_j is fetched at the top of each step, K_{j+1} half way through). */
        load_tile<HeadDim, Br>(Q_i, Q, i * Br, N);
        load_tile<HeadDim, Bc>(K_j, K, 0, N);
        cp_async_commit();

        /* This lane's rows are row0 + g and row0 + g + 8 (h = 0, 1): their m_i and l_i (the same
         * in all four lanes of the quad), and their pieces of O_i as C fragments. All of it stays
         * in this warp's registers for the whole sweep. */
        float O_acc[DT][4] = {};  /* [n8 column tile][C fragment]: (row g + 8h, column 8nt + 2t + e) */
        float m_i[2] = {-INFINITY, -INFINITY}, l_i[2] = {0.f, 0.f};

        for (int j = 0; j <= j_last; j++) {
            cp_async_wait<0>();
            __syncthreads(); /* K_j (and Q_i on the first step) in shared memory; every warp is done
                              * with V_{j-1}, so its buffer is free */

            /* V_j: HBM -> shared memory now, overlapping S_ij and the softmax below */
            load_tile<HeadDim, Bc>(V_j, V, j * Bc, N);
            cp_async_commit();

            /* S_ij = scale * Q_i K_j^T, this warp's 16 rows for all Bc keys. */
            float S_ij[KT][4] = {}; /* [n8 key tile][C fragment] */
#pragma unroll
            for (int k = 0; k < HeadDim; k += 16) {
                uint32_t Qf[4]; /* A fragment: this warp's 16 rows, columns k .. k+15 */
                ldmatrix_x4(Qf, Q_i + (row0 + (lane & 15)) * LDH + k + ((lane >> 4) << 3));
#pragma unroll
                for (int kb = 0; kb < Bc / 16; kb++) {
                    uint32_t Kf[4]; /* B fragments: Kf[0..1] keys 16kb .. +7, Kf[2..3] keys 16kb+8 .. +15 */
                    ldmatrix_x4(Kf, K_j + (kb * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDH + k + (((lane >> 3) & 1) << 3));
                    mma_m16n8k16_f16(S_ij[2 * kb], Qf, &Kf[0]);
                    mma_m16n8k16_f16(S_ij[2 * kb + 1], Qf, &Kf[2]);
                }
            }

            /* The online softmax, per row, in registers: scale into the log2 domain and mask;
             *   m_new = max(m_i, rowmax(S_ij))
             *   P_ij  = exp(S_ij - m_new)
             *   alpha = e^(m_i - m_new);  l_i <- alpha l_i + rowsum(P_ij);  O_i <- diag(alpha) O_i
             * C fragment: S_ij[nt][2h + e] is row row0 + 8h + g, key nt*8 + 2t + e. The four lanes of
             * a quad hold the same row: rowmax and rowsum finish with two shuffles, not shared memory.
             * A row masked so far has m_new = -inf: subtract 0 instead, so P_ij = exp2(-inf) = 0,
             * not exp2(-inf + inf) = NaN. */
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int query = i * Br + row0 + 8 * h + g;
                float mx = -INFINITY;
#pragma unroll
                for (int nt = 0; nt < KT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int key = j * Bc + nt * 8 + 2 * t + e;
                        float s = S_ij[nt][2 * h + e] * scale_log2;
                        if (key >= N || (causal && key > query)) s = -INFINITY; /* tail, causal mask */
                        S_ij[nt][2 * h + e] = s;
                        mx = fmaxf(mx, s);
                    }
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, 2));
                const float m_new = fmaxf(m_i[h], mx);
                const float base = m_new == -INFINITY ? 0.f : m_new;
                float sum = 0.f;
#pragma unroll
                for (int nt = 0; nt < KT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float p = exp2_approx(S_ij[nt][2 * h + e] - base);
                        S_ij[nt][2 * h + e] = p;
                        sum += p;
                    }
                sum += __shfl_xor_sync(FULL_MASK, sum, 1);
                sum += __shfl_xor_sync(FULL_MASK, sum, 2);
                const float alpha = exp2_approx(m_i[h] - base);
                l_i[h] = alpha * l_i[h] + sum;
                m_i[h] = m_new;
#pragma unroll
                for (int nt = 0; nt < DT; nt++) { /* the correction of this row of O_i */
                    O_acc[nt][2 * h] *= alpha;
                    O_acc[nt][2 * h + 1] *= alpha;
                }
                if (t == 0 && query < N) tally.add(CNT_ROW_CORRECT); /* each O row, every step */
            }

            /* P_ij as fp16 A fragments, one per k16 step over the keys: the C layout of two n8 key
             * tiles is the A layout of one k16 tile (mma.cuh), so P never leaves registers. */
            uint32_t P_ij[Bc / 16][4];
#pragma unroll
            for (int kb = 0; kb < Bc / 16; kb++) {
                P_ij[kb][0] = pack_half2(S_ij[2 * kb][0], S_ij[2 * kb][1]);         /* row g,   keys 2t..   */
                P_ij[kb][1] = pack_half2(S_ij[2 * kb][2], S_ij[2 * kb][3]);         /* row g+8, keys 2t..   */
                P_ij[kb][2] = pack_half2(S_ij[2 * kb + 1][0], S_ij[2 * kb + 1][1]); /* row g,   keys 8+2t.. */
                P_ij[kb][3] = pack_half2(S_ij[2 * kb + 1][2], S_ij[2 * kb + 1][3]); /* row g+8, keys 8+2t.. */
            }

            cp_async_wait<0>();
            __syncthreads(); /* V_j in shared memory; every warp is done with K_j, so its buffer is free */

            /* K_{j+1}: HBM -> shared memory now, overlapping P_ij V_j */
            if (j < j_last) load_tile<HeadDim, Bc>(K_j, K, (j + 1) * Bc, N);
            cp_async_commit();

            /* O_i += P_ij V_j, this warp's 16 rows, accumulated in place in fp32 */
#pragma unroll
            for (int kb = 0; kb < Bc / 16; kb++)
#pragma unroll
                for (int n = 0; n < HeadDim; n += 16) {
                    uint32_t Vf[4]; /* B fragments: Vf[0..1] columns n..n+7, Vf[2..3] columns n+8.. */
                    ldmatrix_x4_trans(Vf, V_j + (kb * 16 + (lane & 15)) * LDH + n + ((lane >> 4) << 3));
                    mma_m16n8k16_f16(O_acc[n / 8], P_ij[kb], &Vf[0]);
                    mma_m16n8k16_f16(O_acc[n / 8 + 1], P_ij[kb], &Vf[2]);
                }
        }

        /* The sweep is over: the one normalization, O_i = diag(l_i)^-1 O_i, straight from the
         * registers to HBM in fp16 (O_i's one write), and L = m + log(l) in nats for the backward.
         * The next sweep's Q_i and K_0 go into buffers no warp reads any more (the last step's
         * second barrier), and its first barrier protects V_j. */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int query = i * Br + row0 + 8 * h + g;
            if (query >= N) continue; /* rows past N are never written */
            const float inv_l = l_i[h] > 0.f ? 1.f / l_i[h] : 0.f; /* an all-masked row gives O = 0 */
            if (t == 0) tally.add(CNT_ROW_NORMALIZE);
#pragma unroll
            for (int nt = 0; nt < DT; nt++)
                *(uint32_t *)&O[(size_t)query * HeadDim + nt * 8 + 2 * t] =
                    pack_half2(O_acc[nt][2 * h] * inv_l, O_acc[nt][2 * h + 1] * inv_l);
            if (t == 0) L[query] = m_i[h] * LN2 + logf(l_i[h]);
        }
    }
    tally.flush(counters);
}

/* ---- launcher ---- */

/* The HBM bytes the loop structure moves, walking the (i, j) steps the kernel takes (rows past N
 * are zero-filled, never read): Q_i once; K_j, V_j on every step; O (fp16) and L once. Nothing
 * else: O_i, m_i, l_i never leave the chip. */
template <class Tiles>
void hbm_bytes_with(const struct shape *sh, struct hbm_traffic *t)
{
    constexpr int Bc = Tiles::Bc;
    const int N = sh->N, Tr = CEIL_DIV(N, Br), Tc = CEIL_DIV(N, Bc);
    double kv_rows = 0; /* per head: K (and V) rows read */
    for (int i = 0; i < Tr; i++) {
        const int j_last = sh->causal ? min(Tc - 1, ((i + 1) * Br - 1) / Bc) : Tc - 1;
        for (int j = 0; j <= j_last; j++) kv_rows += min(Bc, N - j * Bc);
    }
    const double heads = (double)sh->B * sh->H, d = sh->d;
    t->Q = heads * N * d * sizeof(__half);
    t->KV = heads * 2.0 * kv_rows * d * sizeof(__half);
    t->O = heads * N * d * sizeof(__half);
    t->O_work = 0;
    t->rowstats = heads * N * sizeof(float); /* L */
    t->q_reads = 1;
}

/* ... with the tiles this device takes */
void hbm_bytes(const struct shape *sh, struct hbm_traffic *t)
{
    char why[160];
    with_tiles(sh->d, gpu_smem_limit(), why, sizeof why, [&](auto tl) {
        hbm_bytes_with<decltype(tl)>(sh, t);
        return 0;
    });
}

template <class Tiles, bool COUNT>
int launch(const struct attn_args *a, char *why, size_t n)
{
    const size_t smem = Tiles::smem_bytes;
    if (int rc = smem_optin(stage7_split_q_kernel<Tiles, COUNT>, smem, Tiles::HeadDim, why, n)) return rc;

    const struct shape *sh = &a->sh;
    const dim3 grid(sh->B * sh->H); /* still one block per (batch, head) */
    const dim3 block(NTHREADS);
    stage7_split_q_kernel<Tiles, COUNT><<<grid, block, smem>>>((const __half *)a->Q, (const __half *)a->K,
                                                         (const __half *)a->V, (__half *)a->O, a->L, sh->N,
                                                         sh->causal, sh->scale * LOG2E, a->counters);
    CUDA_TRY(cudaGetLastError());
    return 0;
}

int forward(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype != DT_F16 || (a->sh.d != 64 && a->sh.d != 128)) {
        snprintf(why, n, "supports fp16 with head dim 64 or 128 (got %s, d=%d)",
                 dtype_name(a->dtype), a->sh.d);
        return ATTN_UNSUPPORTED;
    }
    /* the tiles: the first of the head dim's configurations that fits this device */
    return with_tiles(a->sh.d, gpu_smem_limit(), why, n, [&](auto tl) {
        return a->counters ? launch<decltype(tl), true>(a, why, n) : launch<decltype(tl), false>(a, why, n);
    });
}

/* The tiles forward takes where a block may have `limit` bytes (the summary names them). */
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    (void)backward; /* a forward only */
    return with_tiles(a->sh.d, limit, c->text, sizeof c->text, [&](auto tl) {
        typedef decltype(tl) Tl;
        return tiles_found(c, Br, Tl::Bc, Tl::smem_bytes, "Br=%d Bc=%d", Br, Tl::Bc);
    });
}

} // namespace

extern "C" const struct stage stage7_desc = {
    .name = "stage7",
    .idea = "split Q: each warp owns 16 rows end to end; no shared-memory exchange, P stays in registers",
    .device = ON_GPU,
    .forward = forward,
    .backward = NULL,
    .dims = {64, 128},
    .dtypes = DT_F16,
    .workspace_bytes = NULL,
    .openmp = 0,
    .hbm_traffic = hbm_bytes,
    .measures_backward = 0,
    .arch_sm = 0,
    .tiles = tiles_for,
};
