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
 * Checked against a naive fp64 computation twice: in full on a small shape (B = 1, H = 2,
 * N = CHECK_N, the same d and mask), and on CHECK_ROWS rows of each (batch, head) of the timed
 * run; tolerance common/check.c's rule for fp32 (tol_output). Exit 0 pass, 1 fail, 2 bad usage.
 *
 * Output: one summary line, or with --csv the stages' CSV header and one row (stage cpu-blas).
 * Build: make bench/cpu_blas (needs libopenblas-dev; make bench-cpu builds and runs it).
 * Run:   OMP_NUM_THREADS=2 bench/cpu_blas --heads 8 --seqlen 4096 --dim 64 --csv
 */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* OpenBLAS's own calls (declared by its cblas.h; declared here too for another cblas.h) */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

/* ---- configuration ---- */
#define CHECK_N 197    /* the small shape checked in full: no power of two, so no tile divides it */
#define CHECK_ROWS 16  /* rows of each (batch, head) of the timed run checked (first, last, spread) */
#define U32 5.9604644775390625e-8 /* 2^-24, fp32 unit roundoff (common/check.c) */

struct shape { int B, H, N, d, causal; float scale; };

static size_t elems(const struct shape *sh) { return (size_t)sh->B * sh->H * sh->N * sh->d; }

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) { fprintf(stderr, "cpu_blas: out of memory (%zu bytes)\n", n); exit(2); }
    return p;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* seeded uniform inputs in [-1, 1) (splitmix64), as common/inputs.c draws them */
static void fill_uniform(float *x, size_t n, uint64_t seed)
{
    uint64_t s = seed;
    for (size_t k = 0; k < n; k++) {
        uint64_t z = (s += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        x[k] = (float)((z >> 40) * (2.0 / 16777216.0) - 1.0);
    }
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
/* row i of (b, h) in fp64, naively: O_ref = sum_j softmax_j(scale q_i . k_j) v_j */
static void reference_row(const struct shape *sh, const float *Q_h, const float *K_h, const float *V_h, int i,
                          double *s, double *o)
{
    const int N = sh->N, d = sh->d, n_keys = sh->causal ? i + 1 : N;
    double m = -INFINITY, l = 0;
    for (int j = 0; j < n_keys; j++) {
        double dot = 0;
        for (int c = 0; c < d; c++) dot += (double)Q_h[(size_t)i * d + c] * K_h[(size_t)j * d + c];
        s[j] = dot * sh->scale;
        if (s[j] > m) m = s[j];
    }
    for (int c = 0; c < d; c++) o[c] = 0;
    for (int j = 0; j < n_keys; j++) {
        double p = exp(s[j] - m);
        l += p;
        for (int c = 0; c < d; c++) o[c] += p * V_h[(size_t)j * d + c];
    }
    for (int c = 0; c < d; c++) o[c] /= l;
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t k = 0; k < n; k++) m = fabs(x[k]) > m ? fabs(x[k]) : m;
    return m;
}

/* common/check.c's tol_output for fp32: vmax · u32 · (2 smax + 4 sqrt(N) + 16) */
static double tolerance(const struct shape *sh, const float *Q, const float *K, const float *V)
{
    size_t n = elems(sh);
    double smax = sh->scale * sh->d * max_abs(Q, n) * max_abs(K, n);
    return max_abs(V, n) * U32 * (2 * smax + 4 * sqrt((double)sh->N) + 16);
}

/* the largest |O - O_ref| over the rows checked (every row with all_rows, else CHECK_ROWS a head);
 * a NaN or Inf counts as infinitely wrong */
static double check_rows(const struct shape *sh, const float *Q, const float *K, const float *V, const float *O,
                         int all_rows)
{
    const size_t head = (size_t)sh->N * sh->d;
    const int rows = all_rows || sh->N <= CHECK_ROWS ? sh->N : CHECK_ROWS;
    double *s = xmalloc(sizeof(double) * sh->N), *o = xmalloc(sizeof(double) * sh->d), worst = 0;
    for (int bh = 0; bh < sh->B * sh->H; bh++)
        for (int r = 0; r < rows; r++) {
            /* rows 0 and N - 1 and evenly between them */
            int i = rows == sh->N ? r : (int)((double)r * (sh->N - 1) / (rows - 1));
            reference_row(sh, Q + bh * head, K + bh * head, V + bh * head, i, s, o);
            for (int c = 0; c < sh->d; c++) {
                double got = O[bh * head + (size_t)i * sh->d + c], e = fabs(got - o[c]);
                if (!isfinite(got)) e = INFINITY;
                worst = e > worst ? e : worst;
            }
        }
    free(s);
    free(o);
    return worst;
}

/* run the small shape in full; returns its max_err and sets *tol */
static double check_small(const struct shape *big, uint64_t seed, double *tol)
{
    struct shape sh = {.B = 1, .H = 2, .N = CHECK_N, .d = big->d, .causal = big->causal, .scale = big->scale};
    size_t n = elems(&sh);
    float *Q = xmalloc(4 * n), *K = xmalloc(4 * n), *V = xmalloc(4 * n), *O = xmalloc(4 * n);
    float *S = xmalloc(sizeof(float) * sh.N * sh.N);
    fill_uniform(Q, n, seed * 3 + 0);
    fill_uniform(K, n, seed * 3 + 1);
    fill_uniform(V, n, seed * 3 + 2);
    forward(&sh, Q, K, V, O, S);
    double err = check_rows(&sh, Q, K, V, O, 1);
    *tol = tolerance(&sh, Q, K, V);
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

    size_t n = elems(&sh), s_bytes = sizeof(float) * sh.N * (size_t)sh.N;
    float *Q = xmalloc(4 * n), *K = xmalloc(4 * n), *V = xmalloc(4 * n), *O = xmalloc(4 * n);
    float *S = xmalloc(s_bytes);
    fill_uniform(Q, n, (uint64_t)seed * 3 + 0);
    fill_uniform(K, n, (uint64_t)seed * 3 + 1);
    fill_uniform(V, n, (uint64_t)seed * 3 + 2);

    /* the first run is checked (and is the first warm-up), the rest of the warm-up, the timed runs */
    forward(&sh, Q, K, V, O, S);
    double tol = tolerance(&sh, Q, K, V), err = check_rows(&sh, Q, K, V, O, 0);
    for (int w = 1; w < warmup; w++) forward(&sh, Q, K, V, O, S);
    double *t = xmalloc(sizeof(double) * iters);
    for (int it = 0; it < iters; it++) {
        double t0 = now_ms();
        forward(&sh, Q, K, V, O, S);
        t[it] = now_ms() - t0;
    }
    qsort(t, iters, sizeof *t, cmp_double);
    double ms_min = t[0], ms_median = iters % 2 ? t[iters / 2] : 0.5 * (t[iters / 2 - 1] + t[iters / 2]);

    int pass = err_small <= tol_small && err <= tol;
    double max_err = err_small > err ? err_small : err;
    /* 4 B H N^2 d, halved when causal */
    double flops = 4.0 * sh.B * sh.H * (double)sh.N * sh.N * sh.d / (sh.causal ? 2 : 1);
    double gflops = flops / (ms_median * 1e-3) / 1e9;
    const char *commit = getenv("FA_COMMIT");
    if (!commit || !*commit) commit = "unknown";

    if (csv) {
        printf("stage,direction,gpu,dtype,batch,heads,seqlen,dim,causal,ms_median,ms_min,tflops,"
               "max_err,check,commit,extra_bytes,threads\n");
        printf("cpu-blas,fwd,cpu,fp32,%d,%d,%d,%d,%d,%.4f,%.4f,%.3f,%.3e,%s,%s,%zu,%d\n", sh.B, sh.H, sh.N, sh.d,
               sh.causal, ms_median, ms_min, gflops / 1e3, max_err, pass ? "pass" : "fail", commit, s_bytes, threads);
    } else {
        printf("cpu-blas B=%d H=%d N=%d d=%d %s  fp32 fwd | check %s max_err %.2e (tol %.2e; N=%d in full %.2e) | "
               "%.3f ms (min %.3f) | %.2f GFLOP/s | extra %.1f MiB | %d thread%s\n",
               sh.B, sh.H, sh.N, sh.d, sh.causal ? "causal" : "full", pass ? "PASS" : "FAIL", err, tol, CHECK_N,
               err_small, ms_median, ms_min, gflops, s_bytes / 1048576.0, threads, threads == 1 ? "" : "s");
    }
    if (!pass)
        fprintf(stderr, "cpu_blas: check FAILED: max_err %.3e (tolerance %.3e), small shape %.3e (tolerance %.3e)\n",
                err, tol, err_small, tol_small);
    free(Q), free(K), free(V), free(O), free(S), free(t);
    return pass ? 0 : 1;
}
