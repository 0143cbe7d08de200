/* cpu_blas.c: the CPU yardstick, unfused attention through a BLAS (cpu-blas in bench/data/cpu.csv)
 *
 * What NumPy or PyTorch on the CPU do with softmax(Q K^T / sqrt(d)) V: per (batch, head)
 *   S = scale · Q K^T      one cblas_sgemm, N x N fp32, materialized (4 N^2 bytes)
 *   P = softmax(S)         row by row: max, exp, sum, divide (keys j > i masked when causal)
 *   O = P V                one cblas_sgemm
 * The N x N buffer is allocated once and reused by every (batch, head): extra_bytes is 4 N^2.
 * It is what the CPU stages are measured against: a library's matrix multiply, tuned for this
 * processor, paying for the N x N round trip that stages 2 and 3 avoid.
 *
 * Honest timing, as the stages' harness (common/harness.c, cpu_run_stage): --warmup untimed runs,
 * then --iters timed runs, median and minimum. FLOPs as the stages count them (DESIGN.md,
 * Measuring): 4·B·H·N^2·d, halved when causal (the causal run still computes the whole S and
 * masks it, as the libraries do: the halved count is the stages' yardstick, not the work done).
 * Threads: as many as the stages' OpenMP (omp_get_max_threads(): OMP_NUM_THREADS, else every
 * core), given to OpenBLAS (openblas_set_num_threads) and to the softmax's OpenMP loop.
 *
 * Inputs, check, timing and report are the stages' own harness pieces (common/): the seeded
 * inputs of make_inputs, the fp64 oracle (oracle_forward_row) on a small shape in full (B = 1,
 * H = 2, N = CHECK_N, the same d and mask) and on CHECK_ROWS rows of each (batch, head) of the
 * timed run, common/check.c's fp32 rule (tol_output), median_min, and report.c's summary line or
 * CSV header and row (stage cpu-blas). Exit 0 pass, 1 fail, 2 bad usage.
 * Build: make bench/cpu_blas (needs libopenblas-dev; make bench-cpu builds and runs it).
 * Run:   OMP_NUM_THREADS=2 bench/cpu_blas --heads 8 --seqlen 4096 --dim 64 --csv
 */
#include "common/harness.h"
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* OpenBLAS's own calls (declared by its cblas.h; declared here too for another cblas.h) */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

/* ---- configuration ---- */
#define CHECK_N 197    /* the small shape checked in full: no power of two, so no tile divides it */
#define CHECK_ROWS 16  /* rows of each (batch, head) of the timed run checked (first, last, spread) */

/* what report.c prints as the row's stage */
static const struct stage cpu_blas_desc = {.name = "cpu-blas", .idea = "unfused attention through OpenBLAS",
                                           .device = ON_CPU, .dtypes = DT_F32, .openmp = 1};

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "cpu_blas: out of memory (%zu bytes)\n", n); exit(2); }
    return p;
}

/* ---- the unfused forward ---- */
/* P = softmax(S) in place, row by row; with causal, keys j > i are masked (P_ij = 0) */
static void softmax_rows(float *S, int N, int causal)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *S_i = S + (size_t)i * N;
        int n_keys = causal ? i + 1 : N;
        /* m_i = rowmax(S_i) */
        float m_i = -INFINITY;
        for (int j = 0; j < n_keys; j++) m_i = S_i[j] > m_i ? S_i[j] : m_i;
        /* P_ij = exp(S_ij - m_i), l_i = rowsum(P_i) */
        float l_i = 0;
        for (int j = 0; j < n_keys; j++) l_i += S_i[j] = expf(S_i[j] - m_i);
        /* P_i = P_i / l_i */
        float inv_l = 1.0f / l_i;
        for (int j = 0; j < n_keys; j++) S_i[j] *= inv_l;
        for (int j = n_keys; j < N; j++) S_i[j] = 0;
    }
}

/* O = softmax(scale · Q K^T) V for every (batch, head), through S (N x N, the caller's) */
static void forward(const struct shape *sh, const float *Q, const float *K, const float *V, float *O,
                    float *S)
{
    const int N = sh->N, d = sh->d;
    const size_t head = (size_t)N * d;
    for (int bh = 0; bh < sh->B * sh->H; bh++) {
        const float *Q_h = Q + bh * head, *K_h = K + bh * head, *V_h = V + bh * head;
        /* S = scale · Q K^T   (N x d times d x N) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, N, d, sh->scale, Q_h, d, K_h, d, 0.0f, S, N);
        softmax_rows(S, N, sh->causal);
        /* O = P V             (N x N times N x d) */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, d, N, 1.0f, S, N, V_h, d, 0.0f, O + bh * head, d);
    }
}

/* ---- the check ---- */
/* The largest |O - O_ref| over the rows checked (every row with all_rows, else CHECK_ROWS a head,
 * rows 0 and N - 1 and evenly between), against the fp64 oracle; a NaN or Inf counts as
 * infinitely wrong. *tol gets common/check.c's fp32 allowance for these inputs. */
static double check_rows(const struct shape *sh, const float *Q, const float *K, const float *V, const float *O,
                         int all_rows, double *tol)
{
    const size_t n = shape_elems(sh);
    const int rows = all_rows || sh->N <= CHECK_ROWS ? sh->N : CHECK_ROWS;
    double *o = xmalloc(sizeof(double) * sh->d), lse, worst = 0;
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++)
            for (int r = 0; r < rows; r++) {
                const int i = rows == sh->N ? r : (int)((double)r * (sh->N - 1) / (rows - 1));
                oracle_forward_row(sh, Q, K, V, b, h, i, o, &lse);
                for (int c = 0; c < sh->d; c++) {
                    const double got = O[idx4(sh, b, h, i, c)], e = isfinite(got) ? fabs(got - o[c]) : INFINITY;
                    worst = e > worst ? e : worst;
                }
            }
    free(o);
    *tol = tol_output(sh, DT_F32, max_abs(Q, n), max_abs(K, n), max_abs(V, n));
    return worst;
}

/* run the small shape in full; returns its max_err and sets *tol */
static double check_small(const struct shape *big, uint64_t seed, double *tol)
{
    struct shape sh = {.B = 1, .H = 2, .N = CHECK_N, .d = big->d, .causal = big->causal, .scale = big->scale};
    const size_t n = shape_elems(&sh);
    float *Q = xmalloc(4 * n), *K = xmalloc(4 * n), *V = xmalloc(4 * n), *O = xmalloc(4 * n);
    float *S = xmalloc(sizeof(float) * sh.N * sh.N);
    make_inputs(&sh, seed, 1.0f, DT_F32, Q, K, V);
    forward(&sh, Q, K, V, O, S);
    const double err = check_rows(&sh, Q, K, V, O, 1, tol);
    free(Q), free(K), free(V), free(O), free(S);
    return err;
}

/* ---- the command line ---- */
static void usage(FILE *f)
{
    fprintf(f, "usage: cpu_blas [--batch B] [--heads H] [--seqlen N] [--dim d] [--causal] [--seed S]\n"
               "                [--warmup W] [--iters I] [--csv] [--help]\n"
               "unfused attention through OpenBLAS (S = scale Q K^T, softmax, O = P V), fp32; threads as\n"
               "the stages' OpenMP (OMP_NUM_THREADS, else every core). Defaults: B=1 H=8 N=1024 d=64.\n"
               "example: bench/cpu_blas --heads 8 --seqlen 4096 --dim 64 --warmup 1 --iters 3 --csv\n");
}

static int int_arg(const char *name, const char *v, int min, int *out)
{
    char *end;
    long x = v ? strtol(v, &end, 10) : 0;
    if (!v || *end || x < min || x > (1 << 30)) {
        fprintf(stderr, "cpu_blas: %s needs an integer >= %d\n", name, min);
        return 2;
    }
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv)
{
    struct shape sh = {.B = 1, .H = 8, .N = 1024, .d = 64};
    int warmup = 1, iters = 3, csv = 0, seed = 42;
    for (int a = 1; a < argc; a++) {
        const char *o = argv[a], *v = a + 1 < argc ? argv[a + 1] : NULL;
        int rc = 0, *dst = NULL, min = 1;
        if (!strcmp(o, "--batch")) dst = &sh.B;
        else if (!strcmp(o, "--heads")) dst = &sh.H;
        else if (!strcmp(o, "--seqlen")) dst = &sh.N;
        else if (!strcmp(o, "--dim")) dst = &sh.d;
        else if (!strcmp(o, "--seed")) dst = &seed, min = 0;
        else if (!strcmp(o, "--warmup")) dst = &warmup, min = 0;
        else if (!strcmp(o, "--iters")) dst = &iters;
        else if (!strcmp(o, "--causal")) sh.causal = 1;
        else if (!strcmp(o, "--csv")) csv = 1;
        else if (!strcmp(o, "--help") || !strcmp(o, "-h")) { usage(stdout); return 0; }
        else { fprintf(stderr, "cpu_blas: unknown option %s\n", o); usage(stderr); return 2; }
        if (dst && (rc = int_arg(o, v, min, dst))) return rc;
        if (dst) a++;
    }
    sh.scale = 1.0f / sqrtf((float)sh.d);

    /* the stages' thread count, for OpenBLAS and the softmax alike */
    int threads = omp_get_max_threads();
    openblas_set_num_threads(threads);
    threads = openblas_get_num_threads();
    omp_set_num_threads(threads);

    double tol_small, err_small = check_small(&sh, (uint64_t)seed, &tol_small);

    const size_t n = shape_elems(&sh), s_bytes = sizeof(float) * sh.N * (size_t)sh.N;
    float *Q = xmalloc(4 * n), *K = xmalloc(4 * n), *V = xmalloc(4 * n), *O = xmalloc(4 * n);
    float *S = xmalloc(s_bytes);
    make_inputs(&sh, (uint64_t)seed, 1.0f, DT_F32, Q, K, V);

    /* the first run is checked (and is the first warm-up), the rest of the warm-up, the timed runs */
    forward(&sh, Q, K, V, O, S);
    double tol, err = check_rows(&sh, Q, K, V, O, 0, &tol);
    for (int w = 1; w < warmup; w++) forward(&sh, Q, K, V, O, S);
    double *t = xmalloc(sizeof(double) * iters);
    for (int it = 0; it < iters; it++) {
        double t0 = now_ms();
        forward(&sh, Q, K, V, O, S);
        t[it] = now_ms() - t0;
    }
    const int pass = err_small <= tol_small && err <= tol;
    struct result r = {.st = &cpu_blas_desc, .sh = sh, .dtype = DT_F32, .direction = "fwd",
                       .max_err = err_small > err ? err_small : err, .check = pass ? "pass" : "fail",
                       .extra_bytes = s_bytes, .threads = threads};
    snprintf(r.gpu, sizeof r.gpu, "cpu");
    r.ms_median = median_min(t, iters, &r.ms_min);
    if (csv) {
        print_csv_header(stdout);
        print_csv_row(stdout, &r);
    } else {
        print_summary(stdout, &r);
    }
    if (!pass)
        fprintf(stderr, "cpu_blas: check FAILED: max_err %.3e (tolerance %.3e), N=%d in full %.3e (tolerance %.3e)\n",
                err, tol, CHECK_N, err_small, tol_small);
    free(Q), free(K), free(V), free(O), free(S), free(t);
    return pass ? 0 : 1;
}
