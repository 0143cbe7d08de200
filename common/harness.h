/* harness.h: everything that is not a lesson. Options, inputs, the fp64 oracle, checks,
 * timing, reporting, npy I/O and the tracked scratch allocator. Stages include attn.h (and
 * mem.h on the CPU); the harness main, the GPU runner and the tests include this. */
#ifndef HARNESS_H
#define HARNESS_H

#include "attn.h"
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes shared by every stage binary (stage_failed in attn.c maps a stage's return onto the
 * last two). */
enum { EXIT_PASS = 0, EXIT_CHECK_FAILED = 1, EXIT_USAGE = 2, EXIT_NO_DEVICE = 3, EXIT_CUDA_ERROR = 4 };

/* ---- options (cli.c) ---- */
struct opts {
    struct shape sh;
    enum dtype dtype;
    uint64_t seed;
    float input_scale;    /* inputs drawn from [-input_scale, input_scale] */
    int warmup, iters;
    int check;            /* 0 with --no-check */
    int csv;              /* print the CSV header and one row instead of the summary */
    int csv_no_header;    /* --csv-row: the row alone (the benchmark appends many) */
    int flush_l2;         /* GPU: overwrite L2 before each timed run */
    int counters;         /* GPU: one more run with the kernel's counting build, counts printed */
    int deterministic;    /* backward: --deterministic */
    int hadamard;         /* fp8: --hadamard (default 1); 0 in any other dtype */
    int gpus;             /* a multi-rank stage: --gpus P (0: one rank per visible device) */
    int transport;        /* a multi-rank stage: --transport (enum transport; default TRANSPORT_AUTO) */
    float outliers;       /* --outliers F: OUTLIER_CHANNELS channels of Q and K times F (1: none) */
    int softmax_scale_set;/* --softmax-scale given (else 1/sqrt(d), recomputed when --load sets d) */
    unsigned shape_given; /* SHAPE_GIVEN_* bits: the shape flags on the command line (--load checks them) */
    const char *load_dir, *save_dir;
};
enum { SHAPE_GIVEN_B = 1, SHAPE_GIVEN_H = 2, SHAPE_GIVEN_N = 4, SHAPE_GIVEN_D = 8, SHAPE_GIVEN_NKV = 16, SHAPE_GIVEN_HKV = 32 };
/* Fills `o` from argv with the defaults for `st`. Returns 0, or EXIT_USAGE after printing a
 * one-line reason (or EXIT_PASS with help printed: *done is set). Only the options `st` takes
 * are accepted (and listed by --help); any other is refused as unknown. */
int parse_opts(const struct stage *st, int argc, char **argv, struct opts *o, int *done);
/* ATTN_SMEM_CAP_KB, read from the environment: a GPU stage uses at most that many KiB of shared
 * memory per block, as a GPU with less would (99: an RTX 30, 40 or 50 card; 64: a T4), choosing
 * its tiles accordingly. Returns 0 with *cap in bytes (0: unset, the device's own limit), or
 * EXIT_USAGE with one line in `why` when the value is not a whole number of KiB from 1 on.
 * parse_opts checks it for every GPU stage, so a bad value exits 2 before any device is sought. */
int smem_cap_bytes(size_t *cap, char *why, size_t n);
/* The limits a problem must keep, checked after parsing (and again on loaded inputs): its bytes
 * fit this machine's memory; the inputs' magnitude `amplitude`, times `outliers` on the outlier
 * channels of Q and K (--outliers; 1: none), fits the dtype; the scores that allows (scale * d *
 * amplitude^2 without outliers) stay where fp32 resolves a softmax. Returns 0, or EXIT_USAGE after
 * printing one line that names the limit. */
int check_limits(const struct stage *st, const struct shape *sh, enum dtype dt, double amplitude, double outliers);

/* ---- inputs (inputs.c) ---- */
/* Q, K, V as fp32, each value exactly representable in `dt` (and in fp16), drawn from a seeded
 * generator: the same seed gives the same inputs on every machine. Q holds shape_elems values,
 * K and V shape_kv_elems each. */
void make_inputs(const struct shape *sh, uint64_t seed, float amplitude, enum dtype dt,
                 float *Q, float *K, float *V);
void fill_uniform(float *x, size_t n, uint64_t seed, float amplitude, enum dtype dt);
/* Round loaded values in place to what `dt` can hold (fp32: unchanged). */
void fill_rounded(float *x, size_t n, enum dtype dt);

/* ---- the fp64 oracle (oracle.c) ---- */
/* Forward for one query row (b, h, i): o[d] and the logsumexp, over the keys it sees (keys_seen)
 * of its KV head (kv_head_of). */
void oracle_forward_row(const struct shape *sh, const float *Q, const float *K, const float *V,
                        int b, int h, int i, double *o, double *lse);
void oracle_forward(const struct shape *sh, const float *Q, const float *K, const float *V,
                    double *O, double *L);
/* Backward of the loss sum(dO * O) with respect to Q, K, V, all in fp64. Self-attention shapes
 * only (N_kv = N, H_kv = H: the only ones a backward stage takes). */
void oracle_backward(const struct shape *sh, const float *Q, const float *K, const float *V,
                     const float *dO, double *dQ, double *dK, double *dV);
/* The same for one head (b, h) only: dQ, dK, dV are that head's [N, d] (OpenMP over rows). */
void oracle_backward_head(const struct shape *sh, const float *Q, const float *K, const float *V,
                          const float *dO, int b, int h, double *dQ, double *dK, double *dV);

/* ---- checks (check.c) ---- */
struct cmp {
    double max_err;       /* max |got - want| */
    double mean_err;
    double tol;           /* the allowed |got - want| */
    size_t worst;         /* index of the worst element (a nonfinite one first) */
    double got, want;     /* at the worst element */
    size_t nonfinite;     /* NaN or Inf in got: always a failure */
    size_t count;
    int pass;
};
/* Compare n values of got (fp32) with want (fp64). */
struct cmp compare(const float *got, const double *want, size_t n, double tol);
/* Fold b into a: worst of both, counts added. */
void cmp_merge(struct cmp *a, const struct cmp *b);
/* Fold into c the nonfinite elements of x[0..n), if any (how many, and the first as the worst; the
 * count of elements compared stays c's): for a check that compares a sample of an output, so that
 * an element never written (poisoned, NaN) fails wherever it is. Call it where the sample itself
 * found none, or the sample's are counted twice. */
void cmp_fold_nonfinite(struct cmp *c, const float *x, size_t n);
/* Print "what: FAIL worst [b,h,i,c] got .. want .. | max_err .. mean .. tol .. nonfinite .." */
void cmp_print(FILE *f, const char *what, const struct cmp *c, const struct shape *sh, int is_rows);

/* The allowed error of O and L for a stage computing in `dt` on these inputs; the rule and its
 * reasoning are written beside the definition in check.c. */
double tol_output(const struct shape *sh, enum dtype dt, double qmax, double kmax, double vmax);
double tol_lse(const struct shape *sh, enum dtype dt, double qmax, double kmax);
/* The allowed error of one row of a gradient (dQ, dK or dV): gscale is the larger of the row's
 * largest reference element and the root-sum-square of the terms its elements sum (check.c says
 * why). */
double tol_grad(const struct shape *sh, enum dtype dt, double qmax, double kmax, double dov_max, double gscale);
/* rss[0 .. 3N): for each row of head (b, h)'s dQ, then dK, then dV, the root-sum-square of the
 * terms an element of that row sums (a bound from the rows and columns of dS and P), as a
 * backward in dt rounds them; fp64, O(N^2 d). Self-attention shapes only, as the backward. */
void grad_terms_head(const struct shape *sh, enum dtype dt, const float *Q, const float *K, const float *V,
                     const float *dO, int b, int h, double *rss);
/* Compare head (b, h) of got[t] (dQ, dK, dV: whole tensors) with want[t] (that head's [N, d], fp64)
 * row by row, each row against its own tol_grad; ref_fp32: want is itself an fp32 computation
 * (stage 1), whose allowance is added. Folds the head into c[t] (first: starts them): the worst
 * element is the one furthest past its row's allowance, tol that allowance; max_err the largest
 * error. */
void compare_grad_head(const struct shape *sh, enum dtype dt, const float *Q, const float *K, const float *V,
                       const float *dO, int b, int h, const float *const got[3], const double *const want[3],
                       int ref_fp32, struct cmp c[3], int first);
/* FP8 (DT_FP8): rows rows[0 .. nrows) of head (b, h) of O and L, against the fp64 oracle, each
 * allowed twice the error of the FP8 stage's arithmetic emulated on the host (fp8_forward_row,
 * blocks of FP8_BLOCK_ROWS, Q and K through the Hadamard transform where `hadamard`) plus floor_O
 * (the row's largest error of O) or floor_L; the rule and why beside it in check.c. Folds the
 * rows into cO and cL (first: starts them): the worst element is the one furthest past its row's
 * allowance, tol that allowance. */
void compare_fp8_head(const struct shape *sh, int hadamard, const float *Q, const float *K, const float *V,
                      const float *O, const float *L, int b, int h, const int *rows, int nrows, double floor_O,
                      double floor_L, struct cmp *cO, struct cmp *cL, int first);
double max_abs(const float *x, size_t n);

/* ---- timing (timing.c) ---- */
double now_ms(void);
/* Sorts t[0..n) and returns the median; *min gets the smallest. */
double median_min(double *t, int n, double *min);

/* ---- npy (npy.c) ---- */
/* Reads a 4-D float32 or float16 array into a fresh fp32 buffer; dims in dims[4]. Returns NULL
 * and a one-line reason in `why` on any problem (missing file, bad header, wrong dtype/rank). */
float *npy_read4(const char *path, int dims[4], char *why, size_t n);
int npy_write_f32(const char *path, const float *x, const int *dims, int ndim);

/* ---- the tracked scratch allocator (mem.c; the declarations live in mem.h) ---- */
size_t mem_peak_bytes(void);
void mem_reset_peak(void);

/* ---- report (report.c) ---- */
struct result {
    const struct stage *st;
    struct shape sh;
    enum dtype dtype;
    int hadamard;             /* fp8: --hadamard (the summary says so) */
    float outliers;           /* --outliers F (1: none; the summary shows a larger F) */
    const char *direction;    /* "fwd" or "bwd" */
    char gpu[64];             /* "h200"; "cpu" for a CPU stage */
    char device_name[256];    /* the device's name, shown in the summary */
    char arch[64];            /* GPU: its architecture and the code running on it, "sm_90" or
                               * "sm_90, running compute_75 PTX" (the summary shows it) */
    char tiles[288];          /* GPU: the stage's tiles and their shared memory (stage.tiles), or "" */
    char ranks[2048];         /* a multi-rank stage: its report (rank_hooks.report), lines after the summary */
    double ms_median, ms_min;
    double max_err;           /* vs the reference; negative when not checked */
    const char *check;        /* "pass", "fail" or "skip" */
    char checked[96];         /* what the check compared, where the summary says so (backward) */
    size_t extra_bytes;       /* peak scratch the stage used beyond its inputs and outputs */
    int threads;              /* CPU stages: OpenMP threads */
    int splits;               /* a split-KV stage: the slices of the keys it used (0: not one) */
    int counted;              /* --counters: counts[] holds what the kernel counted */
    unsigned long long counts[N_COUNTERS];
};
void print_summary(FILE *f, const struct result *r);
/* --counters: the kernel's counts per row and the stage's HBM traffic formula, a few lines. */
void print_counters(FILE *f, const struct result *r);
/* --counters --csv: after the result's header and row, this header and one row of the counts and
 * the formula's bytes (--counters --csv-row: the row alone). */
void print_counters_csv_header(FILE *f);
void print_counters_csv_row(FILE *f, const struct result *r);
void print_csv_header(FILE *f);
void print_csv_row(FILE *f, const struct result *r);
/* The bytes of K and V a forward reads at least (each element once): 2 * B * H_kv * N_kv * d
 * elements of the dtype. A split-KV stage's bandwidth is this over its time. */
double kv_bytes(const struct shape *sh, enum dtype dt);
const char *build_commit(void);

/* ---- running a stage (harness.c) ---- */
/* Run `st`'s forward on host fp32 inputs, whatever device it runs on: GPU stages get their
 * inputs converted to the stage's dtype (fp8: fp16, dtype_io) and copied over, and O back as fp32.
 * hadamard: attn_args.hadamard (fp8's --hadamard; 0 in any other dtype). Returns 0, or
 * EXIT_USAGE (unsupported shape) / EXIT_NO_DEVICE with a reason in `why`. */
int run_forward_host(const struct stage *st, const struct shape *sh, enum dtype dt, int hadamard,
                     const float *Q, const float *K, const float *V, float *O, float *L,
                     char *why, size_t n);
/* Check O and L of a run against the reference: stage 1 on the whole output when the problem is
 * small, the fp64 oracle on a sample of heads and rows otherwise. fp8 (dt DT_FP8, run with
 * `hadamard`; 0 in any other dtype): the fp64 oracle on every row or on the sample, each row
 * allowed twice the error of the FP8 stage emulated on the host (compare_fp8_head). Prints a FAIL line with the
 * worst element when it fails. Returns 1 when it passes; *max_err gets O's largest error. */
int check_forward(const struct stage *st, const struct shape *sh, enum dtype dt, int hadamard, const float *Q,
                  const float *K, const float *V, const float *O, const float *L, double *max_err,
                  FILE *log);
/* Check dQ, dK, dV of a backward: against stage 1's backward (on stage 1's own forward) on the
 * whole output when the problem is small, else against the fp64 oracle on three whole heads: the
 * first, the last and one from the middle chosen afresh each run. Prints a FAIL line per gradient
 * when it fails; returns 1 when all pass, *max_err the largest. `what` (may be NULL) gets what was
 * compared, for the summary ("fp64 oracle on heads 0, 63, 17 of 64"). */
int check_backward(const struct shape *sh, enum dtype dt, const float *Q, const float *K, const float *V,
                   const float *dO, const float *dQ, const float *dK, const float *dV, double *max_err,
                   FILE *log, char *what, size_t what_n);
int harness_main(const struct stage *st, int argc, char **argv);

/* The GPU half, in common/cuda/runner.cu. Weak here so that CPU-only binaries link without it. */
int gpu_run_stage(const struct stage *st, const struct opts *o, const float *Q, const float *K,
                  const float *V, float *O, float *L, struct result *r) __attribute__((weak));
/* `counts` NULL: the stage's own kernel; else its counting build, with N_COUNTERS tallies back.
 * hadamard: attn_args.hadamard (fp8's --hadamard; 0 in any other dtype). */
int gpu_forward_host(const struct stage *st, const struct shape *sh, enum dtype dt, int hadamard,
                     const float *Q, const float *K, const float *V, float *O, float *L,
                     unsigned long long *counts, char *why, size_t n) __attribute__((weak));
/* gpu_forward_host for a multi-rank stage (st->ranks): P ranks (0: one per device) over `transport`
 * (enum transport); gpu_forward_host is this with 0 and TRANSPORT_AUTO. */
int gpu_forward_ranks_host(const struct stage *st, const struct shape *sh, enum dtype dt, int gpus, int transport,
                           const float *Q, const float *K, const float *V, float *O, float *L, char *why,
                           size_t n) __attribute__((weak));
/* A backward stage on the device: its forward once (O, L), then its backward; `deterministic` as
 * --deterministic. gpu_run_backward also warms up and times the backward into `r`, and brings the
 * forward's O and L back too where O and L are not NULL (--save). */
int gpu_backward_host(const struct stage *st, const struct shape *sh, enum dtype dt, int deterministic,
                      const float *Q, const float *K, const float *V, const float *dO, float *dQ, float *dK,
                      float *dV, char *why, size_t n) __attribute__((weak));
int gpu_run_backward(const struct stage *st, const struct opts *o, const float *Q, const float *K,
                     const float *V, const float *dO, float *dQ, float *dK, float *dV, float *O, float *L,
                     struct result *r) __attribute__((weak));
/* 0 when a usable CUDA device (sm_75 or newer, with code in this build it can run) is present;
 * else a reason in `why`. */
int gpu_available(char *why, size_t n) __attribute__((weak));
/* After gpu_available: the architecture of the GPU code this build runs on the device, 10 * major
 * + minor of the virtual architecture it was compiled for: the device's own, or lower where the
 * device runs an older build's code (an RTX 4090, sm_89, runs the sm_80 code) or JIT-compiles an
 * older PTX (a build of compute_75 PTX alone runs as 75 on an H200). */
int gpu_code_arch(void) __attribute__((weak));
/* After gpu_available: 0 when the code running on the device computes in `dt`; else one line in
 * `why`, naming `who` (bf16 needs sm_80 code: Turing's tensor cores take fp16 only). */
int gpu_dtype_check(enum dtype dt, const char *who, char *why, size_t n) __attribute__((weak));
/* After gpu_available: the shared memory a block may have, in bytes: the device's opt-in limit,
 * or ATTN_SMEM_CAP_KB's cap where that is less (read once). */
size_t gpu_smem_limit(void) __attribute__((weak));
/* After gpu_available: 0 when the device is of compute capability arch_sm (10 * major + minor), or
 * arch_sm is 0 (any); else one line in `why` naming `who`, what it needs and what this device is
 * ("stage11 needs a Hopper GPU (H100/H200, sm_90); this is NVIDIA A100-SXM4-80GB, sm_80"). */
int gpu_arch_check(int arch_sm, const char *who, char *why, size_t n) __attribute__((weak));

/* Every stage the build knows about, in order (generated from the Makefile's list). */
extern const struct stage *const all_stages[];
extern const int n_all_stages;
extern const struct stage stage1_desc;

#ifdef __cplusplus
}
#endif
#endif
