/* 20_ring.cu: attention across GPUs: ring attention (context parallelism), zigzag for causal
 *
 * Changed from one GPU: the sequence. Each of P ranks (a GPU each) holds 1/P of Q, K and V; the
 *   K/V blocks travel around the ring, and each rank computes the attention of its Q against the
 *   block it holds at each of P steps and merges the partial results by their logsumexp:
 *   - the per-block attention is an existing forward, called through its descriptor: stage 14 on
 *     compute capability 9.0 where its tiles fit (d = 64, 128, 256), stage 9 elsewhere
 *     (block_stage). Both return O and L (logsumexp, nats) for their block, which is all a merge
 *     needs;
 *   - the merge: O = sum_s w_s O_s / sum_s w_s, L = m + log sum_s w_s with w_s = exp(L_s - m)
 *     (common/cuda/merge.cuh, stage 15's merge of KV slices, here across the ring's steps), into a
 *     running O and L in fp32 per rank (stage20_merge_kernel);
 *   - the ring: at step s rank r holds the K/V block of rank r - s; while it computes on it, the
 *     block goes on to rank r + 1 (pass_on: ncclSend / ncclRecv in one ncclGroupStart/End, on a
 *     stream of its own), into the other of two receive buffers, so that step s + 1's transfer
 *     runs under step s's attention. Events order the two: a rank receives into a buffer only once
 *     its compute is done with it, and computes on a block only once it has arrived;
 *   - zigzag for causal: the sequence is cut into 2P chunks of c = ceil(N / 2P) rows and rank r
 *     holds chunks r and 2P - 1 - r (an early and a late one). Every (Q chunk, K/V chunk) pair is
 *     then visible whole (a non-causal call), the diagonal (a causal call) or masked whole (not
 *     called), and every rank does two c x c blocks' worth of work at every step. Contiguous chunks
 *     would leave rank 0 idle after step 0 while rank P - 1 works at every step;
 *   - the transport is one small function with two bodies chosen at run time: NCCL where each rank
 *     has a GPU of its own, and a device-to-device copy where P ranks share GPU 0 (--transport
 *     copy), which tests the ring's logic, the zigzag and the merge on a machine with one GPU.
 *   Any N: the chunks are padded to c rows. Under the causal mask a padded key (position >= N) is
 *   seen only by padded queries, whose rows are dropped; without it, a chunk of t < c real keys is
 *   called with N = t, the Q chunk cut into pieces of t rows (ragged_call).
 * Why: one GPU holds O(N) of attention's memory but spends O(N^2) time: at N = 1M, d = 128, 16
 *   heads, a causal forward is 4.5 PFLOP, about 7.5 s on one H200 at 600 TFLOP/s. P GPUs cut it
 *   P ways if each step's transfer, 8 c d bytes per head (K and V of two chunks of c rows, 16-bit),
 *   hides under its 8 c^2 d FLOPs: c >= F / BW, the GPU's FLOP rate over the link's bytes per
 *   second (notes/20_ring.md works it out).
 * Measured: not yet (notes/20_ring.md; make bench-ring, bench/data/<gpu>x<P>_ring.csv).
 * Run: ./stage20 --gpus 4 --seqlen 131072 --heads 16 --batch 1 --dim 128 --causal
 *      ./stage20 --gpus 4 --transport copy --seqlen 1537 --causal   (four ranks on one GPU)
 */
#include "common/attn.h"
#include "common/cuda/cuda_check.h"
#include "common/cuda/defs.cuh"
#include "common/cuda/launch.cuh"
#include "common/cuda/merge.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>
#include <vector>

extern "C" const struct stage stage9_desc;  /* the per-block attention on any GPU */
extern "C" const struct stage stage14_desc; /* ... and on compute capability 9.0 */

namespace {

/* ---- configuration ---- */

/* The merge kernels: a warp per row (the lanes across its d columns, so a row's loads are one
 * coalesced stretch), eight rows a block. */
constexpr int MERGE_THREADS = 256;
constexpr int ROWS_PER_BLOCK = MERGE_THREADS / WARP_SIZE;

/* An NCCL call inside a stage function: on error, its message in why, ATTN_CUDA_ERROR. */
#define NCCL_TRY(call)                                                                        \
    do {                                                                                      \
        ncclResult_t res_ = (call);                                                           \
        if (res_ != ncclSuccess) {                                                            \
            snprintf(why, n, "%s:%d: NCCL error in %s: %s", __FILE__, __LINE__, #call,        \
                     ncclGetErrorString(res_));                                               \
            return ATTN_CUDA_ERROR;                                                           \
        }                                                                                     \
    } while (0)

__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

/* ---- kernels ---- */

/* One block result (O_s in the input dtype, L_s; its heads R rows apart) merged into a Q chunk's
 * running O_acc, L_acc (fp32, heads c rows apart); first: nothing merged yet (O_acc, L_acc are
 * whatever the last call left). A warp per row of the chunk. */
template <typename T>
__global__ void __launch_bounds__(MERGE_THREADS)
stage20_merge_kernel(const T *O_s, const float *L_s, int R, float *O_acc, float *L_acc, int c, int d, long long rows,
                     int first)
{
    const long long row = (long long)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP_SIZE;
    const int lane = threadIdx.x % WARP_SIZE;
    if (row >= rows) return;
    const long long row_s = row / c * R + row % c; /* the same query in the block result */
    /* m = max(L_acc, L_s); w = exp(L - m) for each; O = (w_acc O_acc + w_s O_s) / (w_acc + w_s) */
    const float L_a = first ? -INFINITY : L_acc[row], L_b = L_s[row_s];
    const float m = fmaxf(L_a, L_b);
    const float w_a = lse_weight(L_a, m), w_b = lse_weight(L_b, m), sum_w = w_a + w_b;
    const float inv = sum_w > 0.f ? 1.f / sum_w : 0.f;
    for (int col = lane; col < d; col += WARP_SIZE) {
        const float o_a = first ? 0.f : O_acc[row * d + col];
        O_acc[row * d + col] = (w_a * o_a + w_b * to_f32(O_s[row_s * d + col])) * inv;
    }
    __syncwarp(); /* every lane has read L_acc[row] before lane 0 writes the merged L over it */
    if (lane == 0) L_acc[row] = lse_merged(m, sum_w);
}

/* The rank's result: the running O (fp32) in the input dtype, and L. */
template <typename T>
__global__ void __launch_bounds__(MERGE_THREADS)
stage20_finalize_kernel(const float *O_acc, const float *L_acc, T *O, float *L, int d, long long rows)
{
    const long long elems = rows * d;
    for (long long k = (long long)blockIdx.x * MERGE_THREADS + threadIdx.x; k < elems; k += (long long)gridDim.x * MERGE_THREADS) {
        O[k] = from_f32<T>(O_acc[k]);
        if (k % d == 0) L[k / d] = L_acc[k / d];
    }
}

/* A K/V chunk of t < c real keys, not causal: the block stage takes as many queries as keys, so the
 * Q chunk (BH heads of c rows) is cut into np = ceil(c / t) pieces of t rows, each a head of its own
 * with a copy of its K and V. Qg: [BH][np t][d] (rows past c zero); Kg, Vg: [BH np][t][d]. */
template <typename T>
__global__ void __launch_bounds__(MERGE_THREADS)
stage20_ragged_kernel(const T *Q, const T *K, const T *V, T *Qg, T *Kg, T *Vg, long long BH, int c, int t, int np, int d)
{
    const long long R = (long long)np * t, q_elems = BH * R * d, kv_elems = BH * np * t * d;
    const long long total = q_elems > kv_elems ? q_elems : kv_elems;
    for (long long k = (long long)blockIdx.x * MERGE_THREADS + threadIdx.x; k < total; k += (long long)gridDim.x * MERGE_THREADS) {
        const int col = (int)(k % d);
        if (k < q_elems) {
            const long long row = k / d, bh = row / R, i = row % R;
            Qg[k] = i < c ? Q[(bh * c + i) * d + col] : from_f32<T>(0.f);
        }
        if (k < kv_elems) {
            const long long row = k / d, head = row / t, j = row % t, bh = head / np;
            Kg[k] = K[(bh * c + j) * d + col];
            Vg[k] = V[(bh * c + j) * d + col];
        }
    }
}

/* ---- the ranks ---- */

/* One rank: its device, streams, communicator and buffers. A "chunk" is [B][H][c][d] of the input
 * dtype; a rank's Q and results are two chunks, [lo][..] then [hi][..] (positions r c .. and
 * (2P - 1 - r) c ..), and a K/V block is four: K lo, K hi, V lo, V hi, sent as one message. */
struct rank {
    int dev;
    cudaStream_t comm;       /* the transfers; the compute runs on the device's default stream,
                              * where the block stages launch (comm is non-blocking: they overlap) */
    ncclComm_t nccl;         /* NULL with the copy transport */
    void *Q, *own, *ring[2]; /* own: this rank's K/V block; ring: the two receive buffers */
    void *O_s;               /* a block call's O (up to 2 chunks: a ragged call's heads are longer) */
    float *L_s;
    float *O_acc, *L_acc;    /* running O, L of the lo and hi chunks, fp32 */
    void *O, *Qg, *Kg, *Vg;  /* the rank's result (2 chunks); a ragged call's scratch (or NULL) */
    float *L;
    void *work;              /* the block stage's workspace */
    int merged[2];           /* block results merged into lo, hi in this call */
    cudaEvent_t computed;    /* the rank's compute of its current step is done */
    cudaEvent_t arrived[2];  /* ring[k] has received its block (recorded by the transfer) */
    cudaEvent_t forwarded;   /* copy transport: the next rank's stream has read this rank's block */
    cudaEvent_t begin, done; /* the rank's part of the last call, for the report */
};

struct ring {
    int P, transport;
    struct shape sh;         /* the whole problem */
    enum dtype dt;
    const struct stage *blk; /* the per-block attention: stage 14 or stage 9 */
    int c;                   /* rows per chunk, ceil(N / 2P) */
    size_t chunk;            /* elements per chunk, B H c d */
    size_t esize;            /* bytes per element */
    cudaEvent_t begin;       /* on device 0: where every rank's part of a call starts */
    std::vector<struct rank> ranks;
};

/* real rows of chunk k: the chunks are c rows each, and the positions past N padding */
int chunk_rows(const struct ring *g, int k)
{
    const long long t = (long long)g->sh.N - (long long)k * g->c;
    return t <= 0 ? 0 : t >= g->c ? g->c : (int)t;
}
/* the chunk that rank r's half h holds: h = 0 the early one, r; h = 1 the late one, 2P - 1 - r */
int chunk_of(const struct ring *g, int r, int h) { return h ? 2 * g->P - 1 - r : r; }

/* The per-block attention: stage 14 where the device is compute capability 9.0 and stage 14 has
 * tiles for d within `limit` bytes of shared memory (gpu_smem_limit(), or a smaller GPU's modelled);
 * stage 9 on any other (and for d = 32). */
const struct stage *block_stage(int dev, const struct attn_args *a, size_t limit)
{
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, dev) != cudaSuccess || p.major != 9 || p.minor != 0) return &stage9_desc;
    struct tile_config c;
    return stage14_desc.tiles(a, 0, limit, &c) == 0 ? &stage14_desc : &stage9_desc;
}

char *ptr(void *base, size_t bytes) { return (char *)base + bytes; }

/* One call of the block stage: queries Q (heads q_stride rows apart, N = rows of them) against K, V
 * (N keys a head), O and L out, heads N rows apart. */
int block_call(const struct ring *g, struct rank *rk, const void *Q, const void *K, const void *V, int N, int heads,
               int causal, char *why, size_t n)
{
    struct attn_args a;
    memset(&a, 0, sizeof a);
    a.sh = g->sh;
    a.sh.B = 1, a.sh.H = heads, a.sh.N = N, a.sh.causal = causal, a.sh.N_kv = 0, a.sh.H_kv = 0, a.sh.splits = 0;
    a.dtype = g->dt;
    a.Q = Q, a.K = K, a.V = V, a.O = rk->O_s, a.L = rk->L_s, a.work = rk->work;
    return g->blk->forward(&a, why, n);
}

/* Rank rk's Q half h against one K/V chunk (K, V; kv_rows real keys), causal or not, merged into
 * its running O and L. */
template <typename T>
int attend(const struct ring *g, struct rank *rk, int h, const T *K, const T *V, int kv_rows, int causal, char *why,
           size_t n)
{
    const int c = g->c, d = g->sh.d, BH = g->sh.B * g->sh.H;
    const T *Q = (const T *)ptr(rk->Q, h * g->chunk * g->esize);
    int R = c; /* rows between heads of the block result */
    if (kv_rows == c || causal) {
        /* c x c (under the causal mask padded keys are seen by padded queries only) */
        if (int rc = block_call(g, rk, Q, K, V, c, BH, causal, why, n)) return rc;
    } else {
        /* a ragged chunk, t < c keys: the queries in pieces of t rows (stage20_ragged_kernel) */
        const int t = kv_rows, np = CEIL_DIV(c, t);
        R = np * t;
        const long long total = (long long)BH * R * d;
        const unsigned blocks = (unsigned)(total / MERGE_THREADS < 4096 ? total / MERGE_THREADS + 1 : 4096);
        stage20_ragged_kernel<T><<<blocks, MERGE_THREADS>>>(Q, K, V, (T *)rk->Qg, (T *)rk->Kg, (T *)rk->Vg, BH, c, t, np, d);
        CUDA_TRY(cudaGetLastError());
        if (int rc = block_call(g, rk, rk->Qg, rk->Kg, rk->Vg, t, BH * np, 0, why, n)) return rc;
    }
    /* O_acc, L_acc of half h <- merge(O_acc, L_acc; O_s, L_s) */
    const long long rows = (long long)BH * c;
    stage20_merge_kernel<T><<<(unsigned)CEIL_DIV(rows, ROWS_PER_BLOCK), MERGE_THREADS>>>(
        (const T *)rk->O_s, rk->L_s, R, rk->O_acc + h * g->chunk, rk->L_acc + (size_t)h * BH * c, c, d, rows,
        rk->merged[h] == 0);
    CUDA_TRY(cudaGetLastError());
    rk->merged[h]++;
    return 0;
}

/* Step s of rank r: its Q (chunks r and 2P - 1 - r) against the K/V block it holds, rank src's
 * (chunks src and 2P - 1 - src). Causal: a pair is the diagonal (a causal call), wholly before
 * (visible: a full call) or wholly after (masked: nothing). */
template <typename T>
int compute_step(const struct ring *g, int r, int s, const void *block, char *why, size_t n)
{
    struct rank *rk = (struct rank *)&g->ranks[r];
    const int src = ((r - s) % g->P + g->P) % g->P;
    for (int h = 0; h < 2; h++) {
        const int q_chunk = chunk_of(g, r, h);
        if (!chunk_rows(g, q_chunk)) continue; /* padding only: its rows are dropped */
        for (int kh = 0; kh < 2; kh++) {
            const int kv_chunk = chunk_of(g, src, kh), kv_rows = chunk_rows(g, kv_chunk);
            if (!kv_rows) continue;                              /* no real key */
            if (g->sh.causal && kv_chunk > q_chunk) continue;     /* masked whole */
            const T *K = (const T *)ptr((void *)block, kh * g->chunk * g->esize);
            const T *V = (const T *)ptr((void *)block, (2 + kh) * g->chunk * g->esize);
            if (int rc = attend<T>(g, rk, h, K, V, kv_rows, g->sh.causal && kv_chunk == q_chunk, why, n)) return rc;
        }
    }
    return 0;
}

/* The block rank r computes on at step s: its own at step 0, then what arrived in ring[s % 2]. */
void *block_at(const struct rank *rk, int s) { return s == 0 ? rk->own : rk->ring[s % 2]; }

/* Step s's transfer: every rank's block of step s to the next rank's free ring buffer, ring[(s + 1)
 * % 2] (which the receiver computed on at step s - 1: the transfer waits for that). The one small
 * function with two bodies: NCCL, each rank on its own device and stream; or, with every rank on
 * GPU 0, a device-to-device copy on the receiver's stream. Records each receiver's `arrived`. */
int pass_on(struct ring *g, int s, char *why, size_t n)
{
    const int P = g->P;
    const size_t bytes = 4 * g->chunk * g->esize;
    for (int r = 0; r < P; r++) { /* the receive buffer is free once its rank's step s - 1 is done */
        CUDA_TRY(cudaSetDevice(g->ranks[r].dev));
        CUDA_TRY(cudaStreamWaitEvent(g->ranks[r].comm, g->ranks[r].computed, 0));
    }
    if (g->transport == TRANSPORT_NCCL) {
        NCCL_TRY(ncclGroupStart()); /* one process drives every rank: all sends and receives in one group */
        ncclResult_t res = ncclSuccess;
        for (int r = 0; r < P && res == ncclSuccess; r++) {
            struct rank *rk = &g->ranks[r];
            res = ncclSend(block_at(rk, s), bytes, ncclUint8, (r + 1) % P, rk->nccl, rk->comm);
            if (res == ncclSuccess) res = ncclRecv(rk->ring[(s + 1) % 2], bytes, ncclUint8, (r + P - 1) % P, rk->nccl, rk->comm);
        }
        const ncclResult_t end = ncclGroupEnd(); /* the group closed even after a failed call in it */
        NCCL_TRY(res);
        NCCL_TRY(end);
    } else {
        /* every rank on GPU 0: rank r's block copied into rank r + 1's buffer, on r + 1's stream (the
         * receiver's, as NCCL's receive), once it is there to read: r received it at step s - 1, on
         * r's stream (arrived), and r + 1's step s - 1 block, the buffer now written, has been read
         * by the copy that passed it on, on r + 2's stream (forwarded) */
        for (int r = 0; r < P; r++) {
            struct rank *rk = &g->ranks[r], *next = &g->ranks[(r + 1) % P];
            if (s > 0) {
                CUDA_TRY(cudaStreamWaitEvent(next->comm, rk->arrived[s % 2], 0));
                CUDA_TRY(cudaStreamWaitEvent(next->comm, next->forwarded, 0));
            }
            CUDA_TRY(cudaMemcpyAsync(next->ring[(s + 1) % 2], block_at(rk, s), bytes, cudaMemcpyDeviceToDevice, next->comm));
        }
        for (int r = 0; r < P; r++) /* rank r's block of step s read, on r + 1's stream */
            CUDA_TRY(cudaEventRecord(g->ranks[r].forwarded, g->ranks[(r + 1) % P].comm));
    }
    for (int r = 0; r < P; r++) {
        CUDA_TRY(cudaSetDevice(g->ranks[r].dev));
        CUDA_TRY(cudaEventRecord(g->ranks[r].arrived[(s + 1) % 2], g->ranks[r].comm));
    }
    return 0;
}

/* ---- the forward ---- */

/* The ring: every rank, every step, every merge, from the ranks' own buffers. Returns with device 0
 * current and its default stream waiting on every rank (the harness's events time all of it). */
template <typename T>
int ring_forward(struct ring *g, char *why, size_t n)
{
    const int P = g->P;
    const long long rows = (long long)g->sh.B * g->sh.H * g->c;
    CUDA_TRY(cudaSetDevice(0));
    CUDA_TRY(cudaEventRecord(g->begin, 0)); /* after the harness's start event */
    for (int r = 0; r < P; r++) {
        struct rank *rk = &g->ranks[r];
        CUDA_TRY(cudaSetDevice(rk->dev));
        CUDA_TRY(cudaStreamWaitEvent(0, g->begin, 0));
        CUDA_TRY(cudaStreamWaitEvent(rk->comm, g->begin, 0));
        CUDA_TRY(cudaEventRecord(rk->begin, 0));
        rk->merged[0] = rk->merged[1] = 0;
    }
    for (int s = 0; s < P; s++) {
        /* step s's transfer first, so that it runs under step s's compute */
        if (s + 1 < P)
            if (int rc = pass_on(g, s, why, n)) return rc;
        for (int r = 0; r < P; r++) {
            struct rank *rk = &g->ranks[r];
            CUDA_TRY(cudaSetDevice(rk->dev));
            if (s > 0) CUDA_TRY(cudaStreamWaitEvent(0, rk->arrived[s % 2], 0)); /* its block is in */
            if (int rc = compute_step<T>(g, r, s, block_at(rk, s), why, n)) return rc;
            CUDA_TRY(cudaEventRecord(rk->computed, 0));
        }
    }
    for (int r = 0; r < P; r++) {
        struct rank *rk = &g->ranks[r];
        CUDA_TRY(cudaSetDevice(rk->dev));
        const long long elems = 2 * rows * g->sh.d;
        const unsigned blocks = (unsigned)(elems / MERGE_THREADS < 4096 ? elems / MERGE_THREADS + 1 : 4096);
        stage20_finalize_kernel<T><<<blocks, MERGE_THREADS>>>(rk->O_acc, rk->L_acc, (T *)rk->O, rk->L, g->sh.d, 2 * rows);
        CUDA_TRY(cudaGetLastError());
        CUDA_TRY(cudaEventRecord(rk->done, 0));
    }
    CUDA_TRY(cudaSetDevice(0));
    for (int r = 0; r < P; r++) CUDA_TRY(cudaStreamWaitEvent(0, g->ranks[r].done, 0));
    return 0;
}


/* ---- the harness's hooks (struct rank_hooks in common/attn.h) ---- */

int forward(const struct attn_args *a, char *why, size_t n)
{
    struct ring *g = (struct ring *)a->rank_state;
    if (!g) {
        snprintf(why, n, "needs its ranks set up first (rank_hooks.setup)");
        return ATTN_UNSUPPORTED;
    }
    if (g->dt == DT_F16) return ring_forward<__half>(g, why, n);
    return ring_forward<__nv_bfloat16>(g, why, n);
}

/* Rows [k c, k c + t) of every head of a [B H][N][d] tensor on the host, to or from a chunk
 * [B H][c][d] on a device: one 2-D copy (rows of t d elements, pitches N d and c d). */
int chunk_copy(const struct ring *g, void *chunk, uint16_t *whole, int k, int to_device, char *why, size_t n)
{
    const int t = chunk_rows(g, k);
    if (!t) return 0;
    const size_t row = (size_t)g->sh.d * g->esize, heads = (size_t)g->sh.B * g->sh.H;
    uint16_t *h = whole + (size_t)k * g->c * g->sh.d;
    if (to_device)
        CUDA_TRY(cudaMemcpy2D(chunk, g->c * row, h, (size_t)g->sh.N * row, t * row, heads, cudaMemcpyHostToDevice));
    else
        CUDA_TRY(cudaMemcpy2D(h, (size_t)g->sh.N * row, chunk, g->c * row, t * row, heads, cudaMemcpyDeviceToHost));
    return 0;
}

/* The same for L, [B H][N] floats, and a chunk of it [B H][c]. */
int chunk_copy_L(const struct ring *g, float *chunk, float *whole, int k, char *why, size_t n)
{
    const int t = chunk_rows(g, k);
    if (!t) return 0;
    const size_t heads = (size_t)g->sh.B * g->sh.H;
    CUDA_TRY(cudaMemcpy2D(whole + (size_t)k * g->c, (size_t)g->sh.N * sizeof(float), chunk, g->c * sizeof(float),
                          t * sizeof(float), heads, cudaMemcpyDeviceToHost));
    return 0;
}

int alloc(void **p, size_t bytes, char *why, size_t n)
{
    *p = NULL;
    if (bytes) CUDA_TRY(cudaMalloc(p, bytes));
    return 0;
}

void teardown(struct attn_args *a);

/* P ranks on their devices: buffers, streams, events, communicators; the inputs (on device 0)
 * brought to the host one tensor at a time and scattered into each rank's chunks (zero past N). */
int setup(struct attn_args *a, char *why, size_t n)
{
    int devices = 0;
    CUDA_TRY(cudaGetDeviceCount(&devices));
    const int P = a->gpus ? a->gpus : devices;
    int transport = a->transport == TRANSPORT_AUTO ? (P <= devices ? TRANSPORT_NCCL : TRANSPORT_COPY) : a->transport;
    if (transport == TRANSPORT_NCCL && P > devices) {
        snprintf(why, n, "--transport nccl puts each rank on a GPU of its own: %d ranks, %d GPU%s visible (--transport "
                 "copy runs them all on GPU 0)", P, devices, devices == 1 ? "" : "s");
        return ATTN_UNSUPPORTED;
    }
    if (a->dtype != DT_F16 && a->dtype != DT_BF16) {
        snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
        return ATTN_UNSUPPORTED;
    }
    struct ring *g = new ring();
    a->rank_state = g;
    g->P = P, g->transport = transport, g->sh = a->sh, g->dt = a->dtype;
    g->blk = block_stage(0, a, gpu_smem_limit());
    g->c = CEIL_DIV(a->sh.N, 2 * P);
    g->esize = 2;
    g->chunk = (size_t)a->sh.B * a->sh.H * g->c * a->sh.d;
    g->ranks.assign(P, rank());
    /* every rank's device the same kind as device 0's: one block stage for all */
    for (int r = 0; r < P && transport == TRANSPORT_NCCL; r++)
        if (block_stage(r, a, gpu_smem_limit()) != g->blk) {
            snprintf(why, n, "GPU %d is not the kind of GPU 0 (a ring of one kind: set CUDA_VISIBLE_DEVICES)", r);
            teardown(a);
            return ATTN_UNSUPPORTED;
        }
    const size_t heads = (size_t)a->sh.B * a->sh.H, count = shape_elems(&a->sh);
    /* ragged chunks (fewer than c real keys) are called in pieces only without the causal mask */
    const bool ragged = !a->sh.causal && (long long)2 * P * g->c != a->sh.N;
    struct attn_args blk_args = *a;
    blk_args.sh.N = g->c;
    const size_t work = g->blk->workspace_bytes ? g->blk->workspace_bytes(&blk_args) : 0;
    const size_t C = g->chunk * g->esize, rowsL = heads * g->c * sizeof(float);
    if (transport == TRANSPORT_NCCL && P > 1) { /* (one rank sends nothing: no communicator) */
        std::vector<int> devs(P);
        std::vector<ncclComm_t> comms(P);
        for (int r = 0; r < P; r++) devs[r] = r;
        NCCL_TRY(ncclCommInitAll(comms.data(), P, devs.data()));
        for (int r = 0; r < P; r++) g->ranks[r].nccl = comms[r];
    }
    for (int r = 0; r < P; r++) {
        struct rank *rk = &g->ranks[r];
        rk->dev = transport == TRANSPORT_NCCL ? r : 0;
        CUDA_TRY(cudaSetDevice(rk->dev));
        /* the transfers' stream at the device's highest priority: stage 14's blocks fill every SM,
         * and a NCCL kernel waiting behind the next block call would not hide under it */
        int least = 0, greatest = 0;
        CUDA_TRY(cudaDeviceGetStreamPriorityRange(&least, &greatest));
        CUDA_TRY(cudaStreamCreateWithPriority(&rk->comm, cudaStreamNonBlocking, greatest));
        cudaEvent_t *quiet[4] = {&rk->computed, &rk->arrived[0], &rk->arrived[1], &rk->forwarded};
        for (cudaEvent_t *e : quiet) CUDA_TRY(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
        CUDA_TRY(cudaEventCreate(&rk->begin));
        CUDA_TRY(cudaEventCreate(&rk->done));
        void **bufs[] = {&rk->Q, &rk->own, &rk->ring[0], &rk->ring[1], &rk->O_s, &rk->O};
        const size_t sizes[] = {2 * C, 4 * C, 4 * C, 4 * C, 2 * C, 2 * C};
        for (int k = 0; k < 6; k++) {
            if (int rc = alloc(bufs[k], sizes[k], why, n)) return rc;
            CUDA_TRY(cudaMemset(*bufs[k], 0, sizes[k])); /* the rows past N are zero */
        }
        if (int rc = alloc((void **)&rk->L_s, 2 * rowsL, why, n)) return rc;
        if (int rc = alloc((void **)&rk->O_acc, 2 * g->chunk * sizeof(float), why, n)) return rc;
        if (int rc = alloc((void **)&rk->L_acc, 2 * rowsL, why, n)) return rc;
        /* (a chunk wholly past N is never merged into: zeros, not uninitialized memory, go to the
         * final conversion) */
        CUDA_TRY(cudaMemset(rk->O_acc, 0, 2 * g->chunk * sizeof(float)));
        CUDA_TRY(cudaMemset(rk->L_acc, 0, 2 * rowsL));
        if (int rc = alloc((void **)&rk->L, 2 * rowsL, why, n)) return rc;
        /* outputs poisoned (NaN): a row the ring never writes fails the check */
        CUDA_TRY(cudaMemset(rk->O, 0xff, 2 * C));
        CUDA_TRY(cudaMemset(rk->L, 0xff, 2 * rowsL));
        if (int rc = alloc(&rk->work, work, why, n)) return rc;
        if (work) CUDA_TRY(cudaMemset(rk->work, 0, work)); /* stage 14's counter starts at zero */
        if (ragged) {
            void **scratch[] = {&rk->Qg, &rk->Kg, &rk->Vg};
            for (void **p : scratch) if (int rc = alloc(p, 2 * C, why, n)) return rc;
        }
    }
    /* scatter, one tensor at a time through the host (one tensor's worth of host memory): Q's
     * chunks r and 2P - 1 - r into rank r's Q, K's and V's into its own block */
    std::vector<uint16_t> host(count);
    const void *src[3] = {a->Q, a->K, a->V};
    for (int t = 0; t < 3; t++) {
        CUDA_TRY(cudaSetDevice(0));
        CUDA_TRY(cudaMemcpy(host.data(), src[t], count * g->esize, cudaMemcpyDeviceToHost));
        for (int r = 0; r < P; r++) {
            struct rank *rk = &g->ranks[r];
            CUDA_TRY(cudaSetDevice(rk->dev));
            for (int h = 0; h < 2; h++) {
                void *dst = t == 0 ? ptr(rk->Q, h * C) : ptr(rk->own, (t == 1 ? h : 2 + h) * C);
                if (int rc = chunk_copy(g, dst, host.data(), chunk_of(g, r, h), 1, why, n)) return rc;
            }
        }
    }
    /* every rank's uploads and zeroing done before the first ring: the comm streams of devices
     * other than 0 wait only on device 0's begin event, not on their own device's default stream */
    for (int r = 0; r < P; r++) {
        CUDA_TRY(cudaSetDevice(g->ranks[r].dev));
        CUDA_TRY(cudaDeviceSynchronize());
    }
    CUDA_TRY(cudaSetDevice(0));
    CUDA_TRY(cudaEventCreateWithFlags(&g->begin, cudaEventDisableTiming));
    return 0;
}

/* Each rank's O and L, its real rows, into the harness's a->O and a->L on device 0 (through the
 * host: outside any timing, and any device to any other). */
int collect(const struct attn_args *a, char *why, size_t n)
{
    const struct ring *g = (const struct ring *)a->rank_state;
    const size_t count = shape_elems(&a->sh), rows = shape_rows(&a->sh), C = g->chunk * g->esize;
    std::vector<uint16_t> O(count);
    std::vector<float> L(rows);
    for (int r = 0; r < g->P; r++) {
        const struct rank *rk = &g->ranks[r];
        CUDA_TRY(cudaSetDevice(rk->dev));
        for (int h = 0; h < 2; h++) {
            const int k = chunk_of(g, r, h);
            if (int rc = chunk_copy(g, ptr(rk->O, h * C), O.data(), k, 0, why, n)) return rc;
            if (int rc = chunk_copy_L(g, rk->L + (size_t)h * g->sh.B * g->sh.H * g->c, L.data(), k, why, n)) return rc;
        }
    }
    CUDA_TRY(cudaSetDevice(0));
    CUDA_TRY(cudaMemcpy(a->O, O.data(), count * g->esize, cudaMemcpyHostToDevice));
    CUDA_TRY(cudaMemcpy(a->L, L.data(), rows * sizeof(float), cudaMemcpyHostToDevice));
    return 0;
}

/* A line for the whole ring, then one per rank: its device, its chunks, its part of the last call. */
void report(const struct attn_args *a, char *text, size_t n)
{
    const struct ring *g = (const struct ring *)a->rank_state;
    size_t k = 0;
    text[0] = 0;
    if (!g) return;
    const double block_mib = 4.0 * g->chunk * g->esize / (1 << 20);
    k += snprintf(text + k, n - k, "ring    %d rank%s on %d GPU%s, %s transport | %d chunks of c=%d rows, rank r holds "
                  "chunks r and %d-r | %d steps, each passing a %.2f MiB K/V block | blocks by %s\n",
                  g->P, g->P == 1 ? "" : "s", g->transport == TRANSPORT_NCCL ? g->P : 1,
                  g->transport == TRANSPORT_NCCL && g->P > 1 ? "s" : "",
                  g->transport == TRANSPORT_NCCL ? "nccl" : "copy", 2 * g->P, g->c, 2 * g->P - 1, g->P, block_mib,
                  g->blk->name);
    for (int r = 0; r < g->P && k < n; r++) {
        const struct rank *rk = &g->ranks[r];
        float ms = -1;
        if (cudaSetDevice(rk->dev) != cudaSuccess || cudaEventElapsedTime(&ms, rk->begin, rk->done) != cudaSuccess)
            ms = -1, cudaGetLastError();
        const int lo = chunk_of(g, r, 0), hi = chunk_of(g, r, 1);
        k += snprintf(text + k, n - k, "rank %-3d GPU %d | rows %lld..%lld and %lld..%lld (%d + %d real) | its part of "
                      "the last run %.3f ms\n", r, rk->dev, (long long)lo * g->c, (long long)(lo + 1) * g->c - 1,
                      (long long)hi * g->c, (long long)(hi + 1) * g->c - 1, chunk_rows(g, lo), chunk_rows(g, hi), ms);
    }
    cudaSetDevice(0);
}

void teardown(struct attn_args *a)
{
    struct ring *g = (struct ring *)a->rank_state;
    if (!g) return;
    for (struct rank &rk : g->ranks) {
        if (cudaSetDevice(rk.dev) != cudaSuccess) continue;
        cudaDeviceSynchronize();
        void *bufs[] = {rk.Q, rk.own, rk.ring[0], rk.ring[1], rk.O_s, rk.L_s, rk.O_acc, rk.L_acc, rk.O, rk.L, rk.work,
                        rk.Qg, rk.Kg, rk.Vg};
        for (void *p : bufs) if (p) cudaFree(p);
        cudaEvent_t evs[] = {rk.computed, rk.arrived[0], rk.arrived[1], rk.forwarded, rk.begin, rk.done};
        for (cudaEvent_t e : evs) if (e) cudaEventDestroy(e);
        if (rk.comm) cudaStreamDestroy(rk.comm);
        if (rk.nccl) ncclCommDestroy(rk.nccl);
    }
    cudaSetDevice(0);
    if (g->begin) cudaEventDestroy(g->begin);
    delete g;
    a->rank_state = NULL;
}

/* The tiles of the block stage this device uses, for the summary. */
int tiles_for(const struct attn_args *a, int backward, size_t limit, struct tile_config *c)
{
    const struct stage *blk = block_stage(0, a, limit);
    const int rc = blk->tiles(a, backward, limit, c);
    if (!rc) {
        char text[sizeof c->text];
        snprintf(text, sizeof text, "blocks by %s: %.160s", blk->name, c->text);
        snprintf(c->text, sizeof c->text, "%s", text);
    }
    return rc;
}

const struct rank_hooks hooks = {setup, collect, report, teardown};

} // namespace

extern "C" const struct stage stage20_desc = {
    .name = "stage20",
    .idea = "across GPUs: ring attention, K/V blocks passed around the ring (NCCL) under the compute, zigzag for causal",
    .device = ON_GPU,
    .forward = forward,
    .backward = NULL,
    .dims = {32, 64, 128, 256},
    .dtypes = DT_F16 | DT_BF16,
    .workspace_bytes = NULL,
    .openmp = 0,
    .hbm_traffic = NULL,
    .measures_backward = 0,
    .arch_sm = 0,
    .kv_cache = 0,
    .max_seqlen = 0,
    .kv_splits = NULL,
    .tiles = tiles_for,
    .ranks = &hooks,
};
