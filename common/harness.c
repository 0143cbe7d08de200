/* harness.c: runs any stage descriptor: inputs, the checked run, the timed runs, the report. */
#include "fp8.h"
#include "harness.h"
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Whole-output checks against stage 1 up to this many multiply-adds in QK^T (stage 1 needs about
 * half a second for it on one core); larger problems check a sample of rows against the oracle. */
#define CHECK_WHOLE_MAX_MACS (1ull << 28)
#define SAMPLE_HEADS 4
#define SAMPLE_ROWS 32

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of host memory (%zu bytes)\n", bytes);
        exit(EXIT_USAGE);
    }
    return p;
}

static void poison(float *x, size_t n)
{
    for (size_t k = 0; k < n; k++) x[k] = NAN; /* an element the stage never writes fails the check */
}

int run_forward_host(const struct stage *st, const struct shape *sh, enum dtype dt, int hadamard, const float *Q,
                     const float *K, const float *V, float *O, float *L, char *why, size_t n)
{
    if (!stage_supports(st, sh, dt, why, n)) return EXIT_USAGE;
    if (st->device == ON_GPU) {
        if (!gpu_forward_host) {
            snprintf(why, n, "%s: this program was built without CUDA", st->name);
            return EXIT_NO_DEVICE;
        }
        return gpu_forward_host(st, sh, dt, hadamard, Q, K, V, O, L, NULL, why, n);
    }
    struct attn_args a = {.sh = *sh, .dtype = dt, .Q = Q, .K = K, .V = V, .O = O, .L = L};
    int rc = st->forward(&a, why, n);
    return rc ? stage_failed(st, rc, why, n) : 0;
}

/* Compare rows [row0, row0 + nrows) of O and L with fp64 references for those rows. */
static void compare_rows(const struct shape *sh, const float *O, const float *L, size_t row0, size_t nrows,
                         const double *Oref, const double *Lref, double tolO, double tolL, struct cmp *cO,
                         struct cmp *cL, int *first)
{
    struct cmp o = compare(O + row0 * sh->d, Oref, nrows * sh->d, tolO);
    struct cmp l = compare(L + row0, Lref, nrows, tolL);
    o.worst += row0 * sh->d;
    l.worst += row0;
    if (*first) { *cO = o; *cL = l; *first = 0; }
    else { cmp_merge(cO, &o); cmp_merge(cL, &l); }
}

int check_forward(const struct stage *st, const struct shape *sh, enum dtype dt, int hadamard, const float *Q,
                  const float *K, const float *V, const float *O, const float *L, double *max_err, FILE *log)
{
    size_t n = shape_elems(sh), nkv = shape_kv_elems(sh);
    double qmax = max_abs(Q, n), kmax = max_abs(K, nkv), vmax = max_abs(V, nkv);
    /* fp8: the fp16 stages' allowance is the floor under twice the emulation's error (check.c) */
    double tolO = tol_output(sh, dt, qmax, kmax, vmax), tolL = tol_lse(sh, dt, qmax, kmax);
    struct cmp cO, cL;
    int first = 1;
    const char *ref;
    double macs = (double)sh->B * sh->H * sh->N * shape_kv_len(sh) * sh->d;
    if (macs <= (double)CHECK_WHOLE_MAX_MACS && dt == DT_FP8) {
        /* every row against the fp64 oracle, each allowed twice the FP8 emulation's error */
        ref = "fp64 oracle (fp8: twice the emulated FP8 stage's error)";
        int *rows = xmalloc(sizeof(int) * (size_t)sh->N);
        for (int i = 0; i < sh->N; i++) rows[i] = i;
        for (int b = 0; b < sh->B; b++)
            for (int h = 0; h < sh->H; h++)
                compare_fp8_head(sh, hadamard, Q, K, V, O, L, b, h, rows, sh->N, tolO, tolL, &cO, &cL, b == 0 && h == 0);
        free(rows);
    } else if (macs <= (double)CHECK_WHOLE_MAX_MACS) {
        /* the whole output, against stage 1 (stage 1 itself against the fp64 oracle) */
        double *Oref = xmalloc(n * sizeof(double)), *Lref = xmalloc(shape_rows(sh) * sizeof(double));
        if (st == &stage1_desc) {
            ref = "fp64 oracle";
            oracle_forward(sh, Q, K, V, Oref, Lref);
        } else {
            ref = "stage1";
            /* stage 1 is an fp32 computation with its own rounding: allow for it on top of the
             * stage's own allowance (for an fp32 stage, twice the fp32 tolerance) */
            tolO += tol_output(sh, DT_F32, qmax, kmax, vmax);
            tolL += tol_lse(sh, DT_F32, qmax, kmax);
            float *O1 = xmalloc(n * sizeof(float)), *L1 = xmalloc(shape_rows(sh) * sizeof(float));
            char why[256];
            if (run_forward_host(&stage1_desc, sh, DT_F32, 0, Q, K, V, O1, L1, why, sizeof why)) {
                fprintf(stderr, "reference failed: %s\n", why);
                exit(EXIT_CHECK_FAILED);
            }
            for (size_t k = 0; k < n; k++) Oref[k] = O1[k];
            for (size_t k = 0; k < shape_rows(sh); k++) Lref[k] = L1[k];
            free(O1);
            free(L1);
        }
        compare_rows(sh, O, L, 0, shape_rows(sh), Oref, Lref, tolO, tolL, &cO, &cL, &first);
        free(Oref);
        free(Lref);
    } else {
        /* a sample: the first and last head plus two more, and in each the first, second, middle
         * and last rows plus random ones, each against the fp64 oracle row by row (fp8: the
         * emulation of those rows beside it, its head quantized once) */
        ref = dt == DT_FP8 ? "fp64 oracle, sampled rows (fp8: twice the emulated FP8 stage's error)" : "fp64 oracle, sampled rows";
        double *o = xmalloc(sh->d * sizeof(double)), lse;
        int rows[SAMPLE_ROWS];
        uint64_t s = 0x243f6a8885a308d3ull;
        int nheads = sh->B * sh->H < SAMPLE_HEADS ? sh->B * sh->H : SAMPLE_HEADS;
        for (int t = 0; t < nheads; t++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            int bh = t == 0 ? 0 : t == 1 ? sh->B * sh->H - 1 : (int)((s >> 33) % (uint64_t)(sh->B * sh->H));
            int b = bh / sh->H, h = bh % sh->H, nrows = 0;
            for (int r = 0; r < SAMPLE_ROWS && r < sh->N; r++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                rows[nrows++] = r == 0 ? 0 : r == 1 ? 1 : r == 2 ? sh->N / 2 : r == 3 ? sh->N - 1 : (int)((s >> 33) % (uint64_t)sh->N);
            }
            if (dt == DT_FP8) {
                compare_fp8_head(sh, hadamard, Q, K, V, O, L, b, h, rows, nrows, tolO, tolL, &cO, &cL, first);
                first = 0;
                continue;
            }
            for (int r = 0; r < nrows; r++) {
                oracle_forward_row(sh, Q, K, V, b, h, rows[r], o, &lse);
                compare_rows(sh, O, L, idx3(sh, b, h, rows[r]), 1, o, &lse, tolO, tolL, &cO, &cL, &first);
            }
        }
        free(o);
        /* and every element finite: the outputs were poisoned (NaN) before the run, so a row the
         * stage never wrote fails even where no sample falls (a generation shape has a row or
         * two per head: the sample sees few of them) */
        if (!cO.nonfinite) cmp_fold_nonfinite(&cO, O, n);
        if (!cL.nonfinite) cmp_fold_nonfinite(&cL, L, shape_rows(sh));
    }
    *max_err = cO.max_err;
    int pass = cO.pass && cL.pass;
    if (!pass && log) {
        fprintf(log, "check against %s failed (rule in common/check.c)\n", ref);
        cmp_print(log, "O", &cO, sh, 0);
        cmp_print(log, "L", &cL, sh, 1);
    }
    return pass;
}

/* ---- the backward ---- */

int check_backward(const struct shape *sh, enum dtype dt, const float *Q, const float *K, const float *V,
                   const float *dO, const float *dQ, const float *dK, const float *dV, double *max_err, FILE *log,
                   char *what, size_t what_n)
{
    const size_t n = shape_elems(sh), nd = (size_t)sh->N * sh->d;
    const float *got[3] = {dQ, dK, dV};
    static const char *names[3] = {"dQ", "dK", "dV"};
    struct cmp c[3];
    const char *ref;
    double *want[3] = {xmalloc(nd * sizeof(double)), xmalloc(nd * sizeof(double)), xmalloc(nd * sizeof(double))};
    double macs = (double)sh->B * sh->H * sh->N * sh->N * sh->d;
    /* each head row by row, each row against the allowance of its own terms (compare_grad_head,
     * the rule in common/check.c) */
    if (macs <= (double)CHECK_WHOLE_MAX_MACS) {
        /* every element, against stage 1's forward and backward in fp32 (stage 1's backward is
         * itself checked against the fp64 oracle and finite differences in the tests) */
        ref = "stage1";
        if (what) snprintf(what, what_n, "every element vs stage1");
        float *O1 = xmalloc(n * sizeof(float)), *L1 = xmalloc(shape_rows(sh) * sizeof(float));
        float *g1[3] = {xmalloc(n * sizeof(float)), xmalloc(n * sizeof(float)), xmalloc(n * sizeof(float))};
        char why[256];
        struct attn_args a = {.sh = *sh, .dtype = DT_F32, .Q = Q, .K = K, .V = V, .O = O1, .L = L1,
                              .dO = dO, .dQ = g1[0], .dK = g1[1], .dV = g1[2]};
        if (stage1_desc.forward(&a, why, sizeof why) || stage1_desc.backward(&a, why, sizeof why)) {
            fprintf(stderr, "reference failed: %s\n", why);
            exit(EXIT_CHECK_FAILED);
        }
        for (int b = 0; b < sh->B; b++)
            for (int h = 0; h < sh->H; h++) {
                for (int t = 0; t < 3; t++)
                    for (size_t k = 0; k < nd; k++) want[t][k] = g1[t][idx4(sh, b, h, 0, 0) + k];
                /* both sides carry rounding: the stage's allowance plus stage 1's (fp32) */
                compare_grad_head(sh, dt, Q, K, V, dO, b, h, got, (const double *const *)want, 1, c, b == 0 && h == 0);
            }
        for (int t = 0; t < 3; t++) free(g1[t]);
        free(O1), free(L1);
    } else {
        /* the first and the last head, whole, against the fp64 oracle, and a head from the middle
         * chosen afresh each run (the summary says which), so that a head-indexing bug between the
         * two ends cannot pass every run */
        ref = "fp64 oracle, first, last and one middle head";
        const int BH = sh->B * sh->H;
        int heads[3] = {0, BH - 1, 0}, n_heads = BH > 1 ? 2 : 1;
        if (BH > 2) {
            unsigned seed = (unsigned)time(NULL) ^ ((unsigned)getpid() << 16);
            heads[n_heads++] = 1 + (int)(rand_r(&seed) % (unsigned)(BH - 2));
        }
        for (int e = 0; e < n_heads; e++) {
            const int b = heads[e] / sh->H, h = heads[e] % sh->H;
            oracle_backward_head(sh, Q, K, V, dO, b, h, want[0], want[1], want[2]);
            compare_grad_head(sh, dt, Q, K, V, dO, b, h, got, (const double *const *)want, 0, c, e == 0);
        }
        if (what) {
            int k = snprintf(what, what_n, "fp64 oracle on heads");
            for (int e = 0; e < n_heads && k > 0 && (size_t)k < what_n; e++)
                k += snprintf(what + k, what_n - k, "%s %d", e ? "," : "", heads[e]);
            if (k > 0 && (size_t)k < what_n) snprintf(what + k, what_n - k, " of %d", BH);
        }
    }
    for (int t = 0; t < 3; t++) free(want[t]);
    int pass = 1;
    *max_err = 0;
    for (int t = 0; t < 3; t++) {
        pass &= c[t].pass;
        if (c[t].max_err > *max_err) *max_err = c[t].max_err;
    }
    if (!pass && log) {
        fprintf(log, "check against %s failed (rule in common/check.c, tol_grad)\n", ref);
        for (int t = 0; t < 3; t++) cmp_print(log, names[t], &c[t], sh, 0);
    }
    return pass;
}

static int save_outputs(const char *dir, const struct shape *sh, const char *const *names, const float *const *src,
                        int count);

/* A stage that measures its backward: inputs and dO (loaded, or a fourth seeded stream), its
 * forward and backward on the device (gpu_run_backward times the backward), the check of dQ,
 * dK, dV, the report, and with --save the tensors for NumPy / PyTorch. */
static int backward_main(const struct stage *st, const struct opts *o, const float *Q, const float *K,
                         const float *V, float *dO)
{
    size_t n = shape_elems(&o->sh), rows = shape_rows(&o->sh);
    float *g[3];
    for (int t = 0; t < 3; t++) g[t] = xmalloc(n * sizeof(float));
    if (!dO) {
        dO = xmalloc(n * sizeof(float));
        fill_uniform(dO, n, o->seed * 3 + 3, 1.0f, o->dtype); /* a fourth seeded stream beside Q, K, V */
    }
    float *O = o->save_dir ? xmalloc(n * sizeof(float)) : NULL, *L = o->save_dir ? xmalloc(rows * sizeof(float)) : NULL;
    struct result r = {.st = st, .sh = o->sh, .dtype = o->dtype, .outliers = o->outliers, .direction = "bwd",
                       .max_err = -1, .check = "skip"};
    int rc = gpu_run_backward(st, o, Q, K, V, dO, g[0], g[1], g[2], O, L, &r);
    int pass = 1;
    if (!rc && o->check) {
        pass = check_backward(&o->sh, o->dtype, Q, K, V, dO, g[0], g[1], g[2], &r.max_err, stderr, r.checked,
                              sizeof r.checked);
        r.check = pass ? "pass" : "fail";
    }
    if (!rc) {
        if (o->csv) {
            if (!o->csv_no_header) print_csv_header(stdout);
            print_csv_row(stdout, &r);
        } else {
            print_summary(stdout, &r);
        }
    }
    if (!rc && o->save_dir) {
        static const char *const names[9] = {"q.npy", "k.npy", "v.npy", "o.npy", "lse.npy", "do.npy", "dq.npy", "dk.npy", "dv.npy"};
        const float *src[9] = {Q, K, V, O, L, dO, g[0], g[1], g[2]};
        if (save_outputs(o->save_dir, &o->sh, names, src, 9)) rc = EXIT_USAGE;
    }
    free(dO), free(O), free(L);
    for (int t = 0; t < 3; t++) free(g[t]);
    return rc ? rc : pass ? EXIT_PASS : EXIT_CHECK_FAILED;
}

/* --load DIR: q.npy, k.npy and v.npy of one shape, which then replaces the command line's (a
 * shape flag that was given must agree). A stage that takes a KV cache reads k.npy and v.npy of
 * their own length and heads, [B, H_kv, N_kv, d] (the batch and head dim q.npy's); for any other
 * they are q.npy's shape. Every value must be finite. */
static int load_inputs(const struct stage *st, const struct opts *o, struct shape *sh, float **Q, float **K,
                       float **V, float **dO)
{
    const char *names[4] = {"q.npy", "k.npy", "v.npy", "do.npy"};
    float **dst[4] = {Q, K, V, dO};
    int dims[4][4];
    char path[4096], why[512];
    int rc = 0;
    /* a backward also reads do.npy, the gradient of the loss with respect to O, when it is there */
    int count = 3;
    if (dO) {
        *dO = NULL;
        snprintf(path, sizeof path, "%s/do.npy", o->load_dir);
        if (access(path, F_OK) == 0) count = 4;
    }
    for (int t = 0; t < count && !rc; t++) {
        snprintf(path, sizeof path, "%s/%s", o->load_dir, names[t]);
        *dst[t] = npy_read4(path, dims[t], why, sizeof why);
        /* what this tensor must agree with: v.npy with k.npy on a KV cache, else q.npy whole, or,
         * k.npy on a KV cache, in its batch and head dim alone */
        const int like = st->kv_cache && t == 2 ? 1 : 0;
        const int batch_and_dim_only = st->kv_cache && t == 1;
        if (!*dst[t]) {
            fprintf(stderr, "%s: --load: %s\n", st->name, why);
            rc = EXIT_USAGE;
        } else if (t && (batch_and_dim_only ? dims[t][0] != dims[0][0] || dims[t][3] != dims[0][3]
                                            : memcmp(dims[t], dims[like], sizeof dims[0]) != 0)) {
            fprintf(stderr, "%s: --load: %s is [%d, %d, %d, %d] but %s is [%d, %d, %d, %d]%s\n", st->name, names[t],
                    dims[t][0], dims[t][1], dims[t][2], dims[t][3], names[like], dims[like][0], dims[like][1],
                    dims[like][2], dims[like][3], batch_and_dim_only ? " (their batch and head dim must agree)" : "");
            rc = EXIT_USAGE;
        } else {
            const size_t n = (size_t)dims[t][0] * dims[t][1] * dims[t][2] * dims[t][3];
            for (size_t k = 0; k < n; k++)
                if (!isfinite((*dst[t])[k])) {
                    fprintf(stderr, "%s: --load: %s holds %g at flat index %zu; inputs must be finite\n", st->name,
                            names[t], (*dst[t])[k], k);
                    rc = EXIT_USAGE;
                    break;
                }
        }
    }
    if (!rc) {
        /* the shape flags given, against the files: q.npy's four, k.npy's heads and length */
        const int given[6] = {o->sh.B, o->sh.H, o->sh.N, o->sh.d, o->sh.H_kv, o->sh.N_kv};
        const int have[6] = {dims[0][0], dims[0][1], dims[0][2], dims[0][3], dims[1][1], dims[1][2]};
        const unsigned bits[6] = {SHAPE_GIVEN_B, SHAPE_GIVEN_H, SHAPE_GIVEN_N, SHAPE_GIVEN_D, SHAPE_GIVEN_HKV, SHAPE_GIVEN_NKV};
        const char *flags[6] = {"--batch", "--heads", "--seqlen", "--dim", "--kv-heads", "--kv-len"};
        for (int j = 0; j < 6 && !rc; j++)
            if ((o->shape_given & bits[j]) && given[j] != have[j]) {
                const int f = j < 4 ? 0 : 1; /* the file the flag is read from */
                fprintf(stderr, "%s: %s %d contradicts --load: %s/%s is [%d, %d, %d, %d] (drop the flag)\n",
                        st->name, flags[j], given[j], o->load_dir, names[f], dims[f][0], dims[f][1], dims[f][2], dims[f][3]);
                rc = EXIT_USAGE;
            }
    }
    if (rc) {
        free(*Q), free(*K), free(*V);
        *Q = *K = *V = NULL;
        if (dO) free(*dO), *dO = NULL;
        return rc;
    }
    sh->B = dims[0][0], sh->H = dims[0][1], sh->N = dims[0][2], sh->d = dims[0][3];
    sh->H_kv = dims[1][1], sh->N_kv = dims[1][2];
    if (!o->softmax_scale_set) sh->scale = 1.0f / sqrtf((float)sh->d);
    return 0;
}

/* --save DIR: proved writable before the run, so that a long run does not end in "cannot write"
 * (made, one level, if missing, a file written and removed, and the directory removed again if
 * it was made here: a run that fails later leaves nothing behind). */
static int save_dir_ready(const struct stage *st, const char *dir)
{
    const int made = mkdir(dir, 0777) == 0;
    if (!made && errno != EEXIST) {
        fprintf(stderr, "%s: --save: cannot create %s: %s\n", st->name, dir, strerror(errno));
        return EXIT_USAGE;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/.write_test", dir);
    FILE *f = fopen(path, "wb");
    const int err = f ? 0 : errno;
    if (f) fclose(f), remove(path);
    if (made) rmdir(dir);
    if (err) {
        fprintf(stderr, "%s: --save: cannot write into %s: %s\n", st->name, dir, strerror(err));
        return EXIT_USAGE;
    }
    return 0;
}

/* A CPU stage on a problem that will take long: time it on one small head first (N = 256, the
 * same d), scale by the FLOPs, and say on stderr what the whole run will take before starting. */
static void warn_if_long(const struct stage *st, const struct opts *o)
{
    if (st->device != ON_CPU) return;
    struct shape small = o->sh;
    small.B = small.H = small.H_kv = 1;
    small.N = o->sh.N < 256 ? o->sh.N : 256;
    small.N_kv = shape_kv_len(&o->sh) < 256 ? shape_kv_len(&o->sh) : 256;
    const double full_flops = attn_flops(&o->sh, 0), small_flops = attn_flops(&small, 0);
    if (full_flops < 50 * small_flops) return; /* at most a few calibration runs' worth */
    size_t n = shape_elems(&small), nkv = shape_kv_elems(&small), rows = shape_rows(&small);
    float *Q = xmalloc(n * sizeof(float)), *K = xmalloc(nkv * sizeof(float)), *V = xmalloc(nkv * sizeof(float));
    float *O = xmalloc(n * sizeof(float)), *L = xmalloc(rows * sizeof(float));
    make_inputs(&small, o->seed, 1.0f, o->dtype, Q, K, V);
    struct attn_args a = {.sh = small, .dtype = o->dtype, .Q = Q, .K = K, .V = V, .O = O, .L = L};
    char why[256];
    double t0 = now_ms();
    int runs = 0;
    do { /* at least 20 ms of runs, so the rate is not one timer tick */
        if (st->forward(&a, why, sizeof why)) break;
        runs++;
    } while (now_ms() - t0 < 20);
    const double ms = runs ? (now_ms() - t0) / runs : 0;
    free(Q), free(K), free(V), free(O), free(L);
    if (!runs || ms <= 0) return;
    const double gflops = small_flops / ms / 1e6;
    const double seconds = full_flops / (gflops * 1e9) * (1 + o->warmup + o->iters); /* the checked run too */
    if (seconds <= 60) return;
    const int hours = seconds > 5400;
    fprintf(stderr, "%s: this run will take about %.0f %s: %d runs of %.3g GFLOP at the %.2f GFLOP/s measured on "
                    "N = %d (Ctrl-C stops it; fewer --iters or a smaller --seqlen shorten it)\n",
            st->name, hours ? seconds / 3600 : seconds / 60, hours ? "hours" : "minutes", 1 + o->warmup + o->iters,
            full_flops / 1e9, gflops, small.N);
}

/* --save DIR: each tensor as a float32 .npy, [B, H, N, d] (lse.npy [B, H, N]; k.npy and v.npy
 * [B, H_kv, N_kv, d], and so dk.npy and dv.npy). */
static int save_outputs(const char *dir, const struct shape *sh, const char *const *names, const float *const *src,
                        int count)
{
    if (mkdir(dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "--save: cannot create %s\n", dir);
        return 1;
    }
    const int dims[4] = {sh->B, sh->H, sh->N, sh->d};
    const int kv_dims[4] = {sh->B, shape_kv_heads(sh), shape_kv_len(sh), sh->d};
    char path[4096];
    for (int t = 0; t < count; t++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[t]);
        const char *kv_names[4] = {"k.npy", "v.npy", "dk.npy", "dv.npy"};
        int kv = 0;
        for (int j = 0; j < 4; j++) kv |= !strcmp(names[t], kv_names[j]);
        if (npy_write_f32(path, src[t], kv ? kv_dims : dims, strcmp(names[t], "lse.npy") ? 4 : 3)) {
            fprintf(stderr, "--save: cannot write %s\n", path);
            return 1;
        }
    }
    return 0;
}

/* CPU stages: one checked run (also the first warm-up), the rest of the warm-up, the timed runs. */
static int cpu_run_stage(const struct stage *st, const struct opts *o, const float *Q, const float *K,
                         const float *V, float *O, float *L, struct result *r)
{
    char why[256];
    struct attn_args a = {.sh = o->sh, .dtype = o->dtype, .Q = Q, .K = K, .V = V, .O = O, .L = L};
    poison(O, shape_elems(&o->sh));
    poison(L, shape_rows(&o->sh));
    mem_reset_peak();
    int rc = st->forward(&a, why, sizeof why);
    if (rc) {
        rc = stage_failed(st, rc, why, sizeof why);
        fprintf(stderr, "%s\n", why);
        return rc;
    }
    r->extra_bytes = mem_peak_bytes();
    for (int w = 1; w < o->warmup; w++) st->forward(&a, why, sizeof why);
    double *t = xmalloc(sizeof(double) * o->iters);
    for (int it = 0; it < o->iters; it++) {
        double t0 = now_ms();
        st->forward(&a, why, sizeof why);
        t[it] = now_ms() - t0;
    }
    r->ms_median = median_min(t, o->iters, &r->ms_min);
    free(t);
    snprintf(r->gpu, sizeof r->gpu, "cpu");
#ifdef _OPENMP
    r->threads = st->openmp ? omp_get_max_threads() : 1;
#else
    r->threads = 1;
#endif
    return 0;
}

/* The largest |value| of loaded Q and K: the amplitude check_limits judges the scores by. */
static double loaded_amplitude(const struct shape *sh, const float *Q, const float *K)
{
    const double q = max_abs(Q, shape_elems(sh)), k = max_abs(K, shape_kv_elems(sh));
    return q > k ? q : k;
}

int harness_main(const struct stage *st, int argc, char **argv)
{
    struct opts o;
    int done, rc = parse_opts(st, argc, argv, &o, &done);
    if (rc || done) return rc;
    float *Q = NULL, *K = NULL, *V = NULL, *dO = NULL;
    if (o.load_dir && (rc = load_inputs(st, &o, &o.sh, &Q, &K, &V, st->measures_backward ? &dO : NULL))) return rc;
    char why[512];
    rc = 0;
    if (!stage_supports(st, &o.sh, o.dtype, why, sizeof why)) {
        fprintf(stderr, "%s\n", why);
        rc = EXIT_USAGE;
    } else if ((rc = check_limits(st, &o.sh, o.dtype, o.load_dir ? loaded_amplitude(&o.sh, Q, K) : o.input_scale,
                                  o.outliers))) {
    } else if (o.save_dir && (rc = save_dir_ready(st, o.save_dir))) {
    } else if (st->device == ON_GPU && !gpu_run_stage) {
        fprintf(stderr, "%s: this program was built without CUDA\n", st->name);
        rc = EXIT_NO_DEVICE;
    } else if (st->device == ON_GPU && gpu_available(why, sizeof why)) {
        fprintf(stderr, "%s: %s\n", st->name, why);
        rc = EXIT_NO_DEVICE;
    } else if (st->device == ON_GPU && gpu_arch_check(st->arch_sm, st->name, why, sizeof why)) {
        fprintf(stderr, "%s\n", why); /* it names the stage */
        rc = EXIT_NO_DEVICE;
    } else if (st->device == ON_GPU && gpu_dtype_check(o.dtype, st->name, why, sizeof why)) {
        fprintf(stderr, "%s\n", why); /* bf16 where the code running is Turing's: it names the stage */
        rc = EXIT_USAGE;
    }
    if (rc) {
        free(Q), free(K), free(V), free(dO);
        return rc;
    }
    size_t n = shape_elems(&o.sh), rows = shape_rows(&o.sh);
    /* the dtype the stage is handed its inputs in (fp8: fp16, which it quantizes itself) */
    const enum dtype io = dtype_io(o.dtype);
    if (o.load_dir) { /* the stage computes in its dtype: round what was loaded to it */
        float *t[4] = {Q, K, V, dO};
        for (int j = 0; j < 4; j++)
            if (t[j]) fill_rounded(t[j], j == 1 || j == 2 ? shape_kv_elems(&o.sh) : n, io);
    } else {
        const size_t nkv = shape_kv_elems(&o.sh);
        Q = xmalloc(n * sizeof(float)), K = xmalloc(nkv * sizeof(float)), V = xmalloc(nkv * sizeof(float));
        make_inputs(&o.sh, o.seed, o.input_scale, io, Q, K, V);
        if (o.outliers > 1.0f) add_outliers(&o.sh, o.outliers, io, Q, K); /* --outliers F */
    }
    if (st->measures_backward) {
        if (!gpu_run_backward) {
            fprintf(stderr, "%s: this program was built without CUDA\n", st->name);
            rc = EXIT_NO_DEVICE;
            free(dO);
        } else {
            rc = backward_main(st, &o, Q, K, V, dO); /* it frees dO */
        }
        free(Q), free(K), free(V);
        return rc;
    }
    warn_if_long(st, &o);
    float *O = xmalloc(n * sizeof(float)), *L = xmalloc(rows * sizeof(float));
    struct result r = {.st = st, .sh = o.sh, .dtype = o.dtype, .hadamard = o.hadamard, .outliers = o.outliers,
                       .direction = "fwd", .max_err = -1, .check = "skip"};
    rc = st->device == ON_GPU ? gpu_run_stage(st, &o, Q, K, V, O, L, &r) : cpu_run_stage(st, &o, Q, K, V, O, L, &r);
    if (rc) {
        free(Q), free(K), free(V), free(O), free(L);
        return rc;
    }
    if (st->kv_splits) r.splits = st->kv_splits(&o.sh); /* the slices it cut the keys into, for the report */
    int pass = 1;
    if (o.check) {
        pass = check_forward(st, &o.sh, o.dtype, o.hadamard, Q, K, V, O, L, &r.max_err, stderr);
        r.check = pass ? "pass" : "fail";
    }
    if (o.csv) {
        if (!o.csv_no_header) print_csv_header(stdout);
        print_csv_row(stdout, &r);
        if (r.counted) { /* --counters: a second CSV block, for scripts */
            if (!o.csv_no_header) print_counters_csv_header(stdout);
            print_counters_csv_row(stdout, &r);
        }
    } else {
        print_summary(stdout, &r);
        if (r.counted) print_counters(stdout, &r);
    }
    if (o.save_dir) {
        static const char *const names[5] = {"q.npy", "k.npy", "v.npy", "o.npy", "lse.npy"};
        const float *src[5] = {Q, K, V, O, L};
        if (save_outputs(o.save_dir, &o.sh, names, src, 5)) rc = EXIT_USAGE;
    }
    free(Q), free(K), free(V), free(O), free(L);
    return rc ? rc : pass ? EXIT_PASS : EXIT_CHECK_FAILED;
}
