/* attn.h: the contract between a stage and the harness.
 *
 * A stage file defines its kernels (or CPU loops) and one `struct stage` descriptor. It has no
 * main(); common/main.c runs any descriptor, and the tests link every stage at once, so every
 * symbol a stage defines carries its own prefix (stage4_...).
 *
 * Tensors are [B, H, N, d], contiguous and row-major. The forward returns O (same dtype as the
 * inputs) and the row logsumexp L (fp32, [B, H, N]), which the backward needs. With a KV cache
 * (stages 1 and 14) K and V are [B, H_kv, N_kv, d]: N_kv keys, and H_kv heads each shared by a
 * group of H / H_kv consecutive query heads (grouped-query attention; H_kv = 1 is multi-query).
 */
#ifndef ATTN_H
#define ATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CEIL_DIV(a, b) (((a) + (b) - 1) / (b))

/* DT_FP8: the stage computes in FP8 e4m3 (stage 19), but is handed Q, K, V in fp16, exactly as a
 * --dtype fp16 stage is (the same buffers, the same inputs bit for bit), quantizes them itself, and
 * returns O in fp16 (L in fp32): every buffer the harness sizes, uploads, downloads or poisons is
 * an fp16 one (dtype_io). Forward only. */
enum dtype { DT_F32 = 1, DT_F16 = 2, DT_BF16 = 4, DT_FP8 = 8 };
#define DT_LAST DT_FP8 /* the highest bit of enum dtype, for loops over a stage's mask */
enum device_kind { ON_CPU, ON_GPU };

struct shape {
    int B, H, N, d;  /* batch, heads, sequence length (any N >= 1), head dim */
    int causal;      /* query i sees keys 0..i (with a KV cache: up to its position, keys_seen) */
    float scale;     /* softmax scale, 1/sqrt(d) unless set */
    /* The KV cache: K and V hold N_kv keys in H_kv heads (H a multiple of H_kv). 0 in either means
     * the queries' own, N or H: self-attention, which every shape written before the KV cache is.
     * Read them through shape_kv_len and shape_kv_heads, never directly. */
    int N_kv, H_kv;
    /* --splits: how many slices a split-KV stage (stage 15) cuts each KV head's keys into; 0: the
     * stage's own rule. How the work is cut, not what is computed: it lives here because the
     * stage's scratch (workspace_bytes) depends on it. */
    int splits;
};

/* One call's tensors. For a CPU stage the pointers are host memory in fp32; for a GPU stage they
 * are device memory in dtype_io(dtype) (O too: fp16 for DT_FP8), L is always fp32. `work` is `workspace_bytes` of scratch
 * the harness allocated for the stage (device memory for a GPU stage), or NULL if it asked none;
 * zeroed once when allocated, and kept for every call on that problem (a stage may keep state in
 * it from one call to the next, as stage 15's merge counters, which each call leaves at zero). */
struct attn_args {
    struct shape sh;
    enum dtype dtype;
    const void *Q, *K, *V;
    void *O;
    float *L;
    const void *dO;          /* backward only: incoming gradient of O */
    void *dQ, *dK, *dV;      /* backward only: outputs */
    void *work;
    int deterministic;       /* backward: bitwise-identical dQ from run to run (--deterministic) */
    /* DT_FP8 (--hadamard): 1 when Q and K are multiplied by the random-sign Hadamard matrix
     * (common/fp8.h, signs from FP8_HADAMARD_SEED) before they are quantized; 0 in any other dtype. */
    int hadamard;
    /* --counters: device memory for N_COUNTERS tallies, zeroed, which the stage's kernel adds
     * the work it did to (a counting instantiation of the kernel); NULL in every timed run. */
    unsigned long long *counters;
    /* ---- a multi-rank stage (stage 20; struct rank_hooks below): 0 and NULL for any other ---- */
    int gpus;                /* --gpus P: the ranks; 0: one per visible device */
    int transport;           /* enum transport: how a block goes to the next rank (--transport) */
    void *rank_state;        /* what the stage's rank_hooks.setup made (per-rank buffers, streams,
                              * communicators); its forward reads and writes those, not Q..L */
};

/* --transport: how a multi-rank stage passes a block to the next rank. TRANSPORT_AUTO: NCCL where
 * every rank has a device of its own (P <= devices), else the copy. */
enum transport { TRANSPORT_AUTO, TRANSPORT_NCCL, TRANSPORT_COPY };

/* What a stage's kernel counts with --counters: the non-matmul work it does on O. */
enum counter {
    CNT_ROW_NORMALIZE,  /* an O row divided by its l (or multiplied by 1/l) */
    CNT_ROW_CORRECT,    /* an O row multiplied by exp(m_old - m_new) */
    N_COUNTERS
};

/* The HBM traffic a GPU stage's loop structure implies, from a formula in the stage: bytes read
 * plus bytes written for each kind of data, and how many times each row of Q is read. */
struct hbm_traffic {
    double Q, KV;        /* inputs read */
    double O;            /* the output written (in the input dtype) */
    double O_work;       /* an fp32 partial O read back and written out between steps */
    double rowstats;     /* m_i, l_i read back and written out between steps, and L written */
    double q_reads;      /* times each Q row comes from HBM */
};

/* Returns 0 on success; otherwise writes a one-line reason into `why` (size `n`) and returns
 * nonzero. A stage checks what it supports here before it launches anything. */
typedef int (*attn_fn)(const struct attn_args *a, char *why, size_t n);

/* A field of struct stage that a descriptor may leave out, zero then. C zeroes what a designated
 * initializer does not name; C++ does too, but g++ -Wextra warns of it unless the field has a
 * default of its own, which this gives it (C++ only: C has no such thing and needs none). */
#ifdef __cplusplus
#define STAGE_FIELD_DEFAULT = {}
#else
#define STAGE_FIELD_DEFAULT
#endif
/* The tiles a GPU stage launches for one problem: the first of its configurations, listed fastest
 * first, whose shared memory fits what the device allows a block (common/cuda/launch.cuh). */
struct tile_config {
    int Br, Bc;          /* query rows per Q tile, keys per K/V tile (a backward: its dK/dV kernel's) */
    size_t smem_bytes;   /* dynamic shared memory per block (a backward: its largest kernel's) */
    char text[192];      /* what the summary shows, "Br=128 Bc=64 Bs=32"; or why none fits */
};

struct stage {
    const char *name;        /* "stage4" */
    const char *idea;        /* one line: what this stage adds */
    enum device_kind device;
    attn_fn forward;
    attn_fn backward;        /* NULL where the stage has none */
    int dims[8];             /* supported head dims, 0-terminated; dims[0] == 0 means any d >= 1 */
    unsigned dtypes;         /* mask of enum dtype */
    /* Scratch the stage needs beside its inputs and outputs for a call with arguments `a` (its
     * shape, dtype and deterministic; no tensors are read); may be NULL. A GPU stage's is device
     * memory the runner allocates; a CPU stage's, host memory it allocates itself, which the
     * limits (check_limits) count beside the inputs so that a problem too large is refused first. */
    size_t (*workspace_bytes)(const struct attn_args *a);
    int openmp;              /* CPU stages: 1 if it spreads work over OpenMP threads */
    /* GPU stages: the bytes its loop structure moves for this shape (--counters shows them). */
    void (*hbm_traffic)(const struct shape *sh, struct hbm_traffic *t);
    /* 1: the stage's program measures its backward (after one forward for O and L): the check is on
     * dQ, dK, dV, and the summary and CSV rows are the backward's (direction "bwd"). */
    int measures_backward;
    /* GPU stages built for one architecture only: its compute capability, 10 * major + minor (90:
     * the Hopper stages, compiled for sm_90a, whose wgmma runs on compute capability 9.0 alone);
     * elsewhere the stage exits 3 and its tests skip. 0: any GPU the build targets (sm_75 on). */
    int arch_sm;
    /* ---- the KV cache (stage 15). A descriptor that does not name these leaves them 0: in C as
     * every field a designated initializer leaves out, in C++ through STAGE_FIELD_DEFAULT ---- */
    /* 1: the stage takes a KV cache, K and V of their own length and heads (--kv-len, --kv-heads);
     * 0: self-attention only (N_kv = N, H_kv = H), anything else refused with exit 2. */
    int kv_cache STAGE_FIELD_DEFAULT;
    /* The most query rows N the stage takes (stage 15, written for generation: 64); 0: any N. */
    int max_seqlen STAGE_FIELD_DEFAULT;
    /* Split-KV stages (--splits): the number of slices of the keys this stage uses on this shape
     * (its rule, or sh->splits where set); NULL for a stage that does not split the keys. */
    int (*kv_splits)(const struct shape *sh) STAGE_FIELD_DEFAULT;
    /* GPU stages: the tiles its forward (backward = 1: its backward) takes for the problem in `a`
     * (shape, dtype, deterministic; no tensors are read) where a block may have `smem_limit` bytes
     * of shared memory. Returns 0 with *c filled, or ATTN_UNSUPPORTED with why none fits in c->text.
     * The launcher makes the same choice (it calls the same code); the runner asks first, to name
     * the tiles in the summary and to refuse a problem no configuration fits before any launch.
     * NULL: the stage does not say (it still refuses a tile too large, at launch). */
    int (*tiles)(const struct attn_args *a, int backward, size_t smem_limit, struct tile_config *c) STAGE_FIELD_DEFAULT;
    /* A multi-rank stage (--gpus, --transport): its hooks, which the harness calls around its runs
     * (struct rank_hooks); NULL: one device, as every other stage. */
    const struct rank_hooks *ranks STAGE_FIELD_DEFAULT;
};

/* A stage whose ranks hold parts of the problem on devices of their own (stage 20: ring attention
 * over P GPUs). The harness owns the transfers, so it calls these around the usual runs:
 *   setup    once, after Q, K, V are on device 0 (a->Q, a->K, a->V) and before the checked run:
 *            allocates each rank's buffers on its device, makes the streams and communicators,
 *            scatters the inputs into the ranks' parts, keeps all of it in a->rank_state;
 *   forward  (the descriptor's) then works from those per-rank buffers alone: the timed region is
 *            the ranks' work and their transfers, no allocation, no host copy; it returns with
 *            device 0's default stream waiting on every rank, so the harness's events time all;
 *   collect  after a checked run, outside any timing: each rank's O and L into a->O and a->L;
 *   report   after the timed runs: lines for the summary (a line per rank, one for the whole);
 *   teardown last, frees what setup made (a->rank_state NULL again).
 * setup and collect return 0, ATTN_UNSUPPORTED (P or the transport refused: exit 2) or
 * ATTN_CUDA_ERROR, with the reason in why. */
struct rank_hooks {
    int (*setup)(struct attn_args *a, char *why, size_t n);
    int (*collect)(const struct attn_args *a, char *why, size_t n);
    void (*report)(const struct attn_args *a, char *text, size_t n);
    void (*teardown)(struct attn_args *a);
};

/* FLOPs as the FA2 paper counts them: 4*B*H*N^2*d for the forward, halved when causal;
 * the backward is 2.5x the forward. With a KV cache, 4*B*H*N*N_kv*d, and causal takes away the
 * masked triangle, N^2/2 of the N x N_kv scores (so N = N_kv is the paper's half again, and one
 * query, N = 1, loses nothing worth counting). */
double attn_flops(const struct shape *sh, int backward);

/* What a stage function's nonzero return means: ATTN_UNSUPPORTED (a shape or dtype it refuses;
 * the harness exits 2) or ATTN_CUDA_ERROR (the CUDA runtime failed; the harness exits 4). */
enum { ATTN_UNSUPPORTED = 1, ATTN_CUDA_ERROR = 4 };

/* After a stage function returned rc != 0 with its reason in `why`: puts the stage's name in
 * front of the reason ("stage7: d=64 needs ...") and returns the exit code rc calls for. */
int stage_failed(const struct stage *st, int rc, char *why, size_t n);

/* Does `st` support this shape and dtype? If not, writes why not into `why`: a shape that is no
 * attention problem (H not a multiple of H_kv; causal with fewer keys than queries), a KV cache or
 * a query length the stage does not take, or a head dim or dtype it lacks (with what it supports). */
int stage_supports(const struct stage *st, const struct shape *sh, enum dtype dt, char *why, size_t n);

const char *dtype_name(enum dtype dt);
/* The dtype of the tensors a stage computing in dt is handed and returns: dt itself, but fp16 for
 * DT_FP8 (the stage quantizes its fp16 inputs itself). dtype_size is the size of one of those. */
enum dtype dtype_io(enum dtype dt);
size_t dtype_size(enum dtype dt);

/* Index of element (b, h, i, c) in a [B, H, N, d] tensor, and of row (b, h, i) in [B, H, N]. */
static inline size_t idx4(const struct shape *sh, int b, int h, int i, int c)
{
    return (((size_t)b * sh->H + h) * sh->N + i) * sh->d + c;
}
static inline size_t idx3(const struct shape *sh, int b, int h, int i)
{
    return ((size_t)b * sh->H + h) * sh->N + i;
}
static inline size_t shape_elems(const struct shape *sh) { return (size_t)sh->B * sh->H * sh->N * sh->d; }
static inline size_t shape_rows(const struct shape *sh) { return (size_t)sh->B * sh->H * sh->N; }

/* ---- the KV side of a shape ---- */
static inline int shape_kv_len(const struct shape *sh) { return sh->N_kv ? sh->N_kv : sh->N; }
static inline int shape_kv_heads(const struct shape *sh) { return sh->H_kv ? sh->H_kv : sh->H; }
/* 1 when K and V are the queries' own length and heads (every stage takes that). */
static inline int shape_is_self(const struct shape *sh)
{
    return shape_kv_len(sh) == sh->N && shape_kv_heads(sh) == sh->H;
}
/* The KV head that query head h reads: heads come in groups of H / H_kv consecutive ones, one KV
 * head each (as torch's enable_gqa, or K and V repeat_interleave'd over the heads). */
static inline int kv_head_of(const struct shape *sh, int h) { return h / (sh->H / shape_kv_heads(sh)); }
/* Index of element (b, hk, j, c) in K or V, [B, H_kv, N_kv, d]. */
static inline size_t idx4_kv(const struct shape *sh, int b, int hk, int j, int c)
{
    return (((size_t)b * shape_kv_heads(sh) + hk) * shape_kv_len(sh) + j) * sh->d + c;
}
static inline size_t shape_kv_elems(const struct shape *sh)
{
    return (size_t)sh->B * shape_kv_heads(sh) * shape_kv_len(sh) * sh->d;
}
/* How many keys query i sees, keys 0 .. keys_seen - 1: all N_kv, or, causal, those up to its own
 * position. The N queries are the last N positions of the N_kv (bottom-right aligned, as
 * FlashAttention does; N_kv >= N when causal), so query i sits at N_kv - N + i; with N_kv = N that
 * is key i, the square causal mask. */
static inline int keys_seen(const struct shape *sh, int i)
{
    return sh->causal ? shape_kv_len(sh) - sh->N + i + 1 : shape_kv_len(sh);
}

#ifdef __cplusplus
}
#endif
#endif
