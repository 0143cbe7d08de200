/* test_cli.c: the command line, run against the built stage binaries.
 *
 * Every program is started with posix_spawn (no shell, no quoting) from the repository root,
 * where `make test` runs the suite, with stdout and stderr captured in files. Bad usage must exit
 * 2 with one line on stderr saying what is wrong, print nothing on stdout and write nothing:
 * each bad case passes `--save <path that does not exist>` and the path must still not exist
 * afterwards. Each test works in a fresh temporary directory, removed after it.
 */
#define _GNU_SOURCE /* nftw, environ */
#include "common_test.h"
#include "common/fp8.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <ftw.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

/* ---- running a program ---- */

static char test_tmp[64]; /* this test's directory, made on first use */

static void test_path(char *buf, size_t n, const char *name)
{
    if (!test_tmp[0]) {
        strcpy(test_tmp, "/tmp/attn_tests.XXXXXX");
        cr_assert(mkdtemp(test_tmp) != NULL, "mkdtemp: %s", strerror(errno));
    }
    snprintf(buf, n, "%s/%s", test_tmp, name);
}

static int test_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    return remove(path);
}

/* Criterion runs .fini after a failed test too (not after a skipped one: those skip before
 * they make the directory). */
static void test_cli_fini(void)
{
    if (test_tmp[0]) nftw(test_tmp, test_rm, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(cli, .fini = test_cli_fini);

struct test_proc {
    int code;          /* exit status */
    char out[16384];   /* stdout, NUL-terminated (cut at the buffer's size) */
    char err[16384];   /* stderr */
};

static void test_slurp(const char *path, char *buf, size_t n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f != NULL, "cannot read back %s", path);
    size_t got = fread(buf, 1, n - 1, f);
    buf[got] = 0;
    fclose(f);
}

/* Runs argv (argv[0] a path like "./stage1", NULL-terminated) and waits for it. */
static void test_spawn(char *const argv[], struct test_proc *p)
{
    cr_assert(access(argv[0], X_OK) == 0,
              "%s is not built: run the suite from the repository root after `make all`", argv[0]);
    char out[128], err[128];
    test_path(out, sizeof out, "stdout");
    test_path(err, sizeof err, "stderr");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_addopen(&fa, 2, err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    cr_assert(rc == 0, "posix_spawn %s: %s", argv[0], strerror(rc));
    int status;
    while (waitpid(pid, &status, 0) < 0) cr_assert(errno == EINTR, "waitpid: %s", strerror(errno));
    test_slurp(out, p->out, sizeof p->out);
    test_slurp(err, p->err, sizeof p->err);
    remove(out), remove(err);
    cr_assert(WIFEXITED(status), "%s died of signal %d; stderr:\n%s", argv[0], WTERMSIG(status), p->err);
    p->code = WEXITSTATUS(status);
}

static int test_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* A failed run exits `code` with exactly one line on stderr that contains `expect`, and nothing
 * on stdout. `what` names the command line in the messages. */
static void test_assert_one_line_failure(const struct test_proc *p, int code, const char *what, const char *expect)
{
    cr_assert(p->code == code, "%s: exit %d, want %d; stderr:\n%s", what, p->code, code, p->err);
    cr_assert(p->out[0] == 0, "%s: printed on stdout:\n%s", what, p->out);
    size_t len = strlen(p->err);
    cr_assert(len > 1 && p->err[len - 1] == '\n' && test_count_lines(p->err) == 1,
              "%s: stderr must be one line saying why, got:\n%s", what, p->err);
    cr_assert(expect == NULL || strstr(p->err, expect) != NULL, "%s: the reason does not mention '%s': %s", what,
              expect, p->err);
}

/* ---- npy files for --load ---- */

#define TEST_NPY_B 1
#define TEST_NPY_H 2
#define TEST_NPY_N 8
#define TEST_NPY_D 16

/* A well-formed .npy of `count` zero elements of `esz` bytes with any descr and shape: enough
 * to make files of a dtype npy_write_f32 cannot write. */
static void test_write_npy_raw(const char *path, const char *descr, const char *shape, size_t count, size_t esz)
{
    char hdr[128];
    int k = snprintf(hdr, sizeof hdr, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    while ((10 + k + 1) % 64) hdr[k++] = ' '; /* the data starts 64-byte aligned, as NumPy writes it */
    hdr[k++] = '\n';
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)k, 0};
    FILE *f = fopen(path, "wb");
    cr_assert(f != NULL, "cannot write %s", path);
    void *zeros = calloc(count, esz);
    cr_assert(fwrite(pre, 1, 10, f) == 10 && fwrite(hdr, 1, (size_t)k, f) == (size_t)k &&
              fwrite(zeros, esz, count, f) == count && fclose(f) == 0, "cannot write %s", path);
    free(zeros);
}

/* What --load's directory holds: good q.npy and v.npy, and a k.npy that is good, missing, 3-D, of
 * other dims than q.npy, of a dtype the loader does not read, holding a NaN, or with no data for a
 * shape whose element count wraps a 64-bit size around to 0 (2^30 * 2^30 * 16 * 1). */
enum test_load { TEST_NO_LOAD, TEST_LOAD_GOOD, TEST_LOAD_NO_K, TEST_LOAD_K_3D, TEST_LOAD_K_DIMS, TEST_LOAD_K_F8,
                 TEST_LOAD_K_I4, TEST_LOAD_K_NAN, TEST_LOAD_K_WRAP };

static void test_write_inputs(const char *dir, enum test_load kind)
{
    int dims[4] = {TEST_NPY_B, TEST_NPY_H, TEST_NPY_N, TEST_NPY_D};
    size_t n = (size_t)TEST_NPY_B * TEST_NPY_H * TEST_NPY_N * TEST_NPY_D;
    float *x = test_floats(n);
    char path[256], shape[64];
    snprintf(shape, sizeof shape, "(%d, %d, %d, %d)", TEST_NPY_B, TEST_NPY_H, TEST_NPY_N, TEST_NPY_D);
    cr_assert(mkdir(dir, 0700) == 0, "mkdir %s: %s", dir, strerror(errno));
    const char *names[3] = {"q.npy", "k.npy", "v.npy"};
    for (int t = 0; t < 3; t++) {
        snprintf(path, sizeof path, "%s/%s", dir, names[t]);
        fill_uniform(x, n, 42 + t, 1, DT_F16);
        if (t != 1 || kind == TEST_LOAD_GOOD || kind == TEST_LOAD_K_NAN) {
            if (t == 1 && kind == TEST_LOAD_K_NAN) x[n / 2] = NAN;
            cr_assert(npy_write_f32(path, x, dims, 4) == 0, "cannot write %s", path);
            continue;
        }
        switch (kind) {
        case TEST_LOAD_K_3D: cr_assert(npy_write_f32(path, x, dims + 1, 3) == 0); break;
        case TEST_LOAD_K_DIMS: { /* one row more than q.npy */
            int other[4] = {TEST_NPY_B, TEST_NPY_H, TEST_NPY_N + 1, TEST_NPY_D};
            size_t n_other = (size_t)TEST_NPY_B * TEST_NPY_H * (TEST_NPY_N + 1) * TEST_NPY_D;
            float *y = test_floats(n_other);
            fill_uniform(y, n_other, 43, 1, DT_F16);
            cr_assert(npy_write_f32(path, y, other, 4) == 0);
            free(y);
            break;
        }
        case TEST_LOAD_K_F8: test_write_npy_raw(path, "<f8", shape, n, 8); break;
        case TEST_LOAD_K_I4: test_write_npy_raw(path, "<i4", shape, n, 4); break;
        case TEST_LOAD_K_WRAP: test_write_npy_raw(path, "<f4", "(1073741824, 1073741824, 16, 1)", 0, 4); break;
        default: break; /* TEST_LOAD_NO_K: no k.npy at all */
        }
    }
    free(x);
}

/* ---- bad command lines: exit 2, one line, nothing written ---- */

/* Plain values only (Criterion copies parameters into a child process). */
struct test_bad_cli {
    char bin[16];          /* the program */
    char args[8][24];      /* the bad part, last on the line ("" ends it) */
    enum test_load load;   /* --load DIR with this content first, if any */
    char expect[48];       /* the one-line reason must mention this */
    int no_save;           /* 1: no --save first (a stage that does not take it) */
};

static const struct test_bad_cli test_bad_cases[] = {
    {"./stage1", {"--seqlen", "0"}, TEST_NO_LOAD, "--seqlen 0", 0},
    {"./stage1", {"--batch", "-3"}, TEST_NO_LOAD, "--batch -3", 0},
    {"./stage1", {"--heads", "abc"}, TEST_NO_LOAD, "--heads abc", 0},
    {"./stage1", {"--dim", "1.5"}, TEST_NO_LOAD, "--dim 1.5", 0},
    {"./stage1", {"--iters", "0"}, TEST_NO_LOAD, "--iters 0", 0},
    {"./stage1", {"--dtype", "fp8"}, TEST_NO_LOAD, "fp8", 0},
    {"./stage1", {"--dtype", "fp16"}, TEST_NO_LOAD, "fp16", 0},       /* a CPU stage runs fp32 only */
    {"./stage3", {"--dtype", "bf16"}, TEST_NO_LOAD, "bf16", 0},
    /* fp8: a forward of stage 19 only; --hadamard only where a stage has fp8; --outliers F >= 1 */
    {"./stage9", {"--dtype", "fp8"}, TEST_NO_LOAD, "does not support dtype fp8", 0},
    {"./stage10", {"--dtype", "fp8"}, TEST_NO_LOAD, "fp8 is a forward only", 0},
    {"./stage3", {"--dtype", "fp4"}, TEST_NO_LOAD, "fp32, fp16, bf16 or fp8", 0},
    {"./stage3", {"--hadamard", "1"}, TEST_NO_LOAD, "unknown option --hadamard", 0},
    {"./stage3", {"--outliers", "0.5"}, TEST_NO_LOAD, "--outliers 0.5", 0},
    {"./stage3", {"--outliers", "inf"}, TEST_NO_LOAD, "--outliers inf", 0},
    {"./stage3", {"--outliers", "x"}, TEST_NO_LOAD, "--outliers x", 0},
    {"./stage3", {"--outliers", "70000"}, TEST_NO_LOAD, "65504", 0},
    {"./stage3", {"--input-scale", "2000", "--outliers", "40"}, TEST_NO_LOAD, "--input-scale times --outliers", 0},
    {"./stage3", {"--dim", "64", "--outliers", "5000"}, TEST_NO_LOAD, "2^22", 0},
    {"./stage3", {"--outliers", "50"}, TEST_LOAD_GOOD, "--load", 0},
    {"./stage1", {"--frobnicate"}, TEST_NO_LOAD, "--frobnicate", 0},
    {"./stage1", {"--seqlen"}, TEST_NO_LOAD, "--seqlen", 0},          /* its value missing at the end */
    {"./stage3", {""}, TEST_LOAD_NO_K, "k.npy", 0},
    {"./stage3", {""}, TEST_LOAD_K_3D, "k.npy", 0},
    {"./stage3", {""}, TEST_LOAD_K_DIMS, "k.npy", 0},
    {"./stage3", {""}, TEST_LOAD_K_F8, "<f8", 0},
    {"./stage3", {""}, TEST_LOAD_K_I4, "<i4", 0},
    {"./stage3", {""}, TEST_LOAD_K_WRAP, "shorter than its shape", 0},
    /* a value given to a flag that takes none */
    {"./stage3", {"--seqlen", "64", "--causal=0"}, TEST_NO_LOAD, "--causal takes no value", 0},
    {"./stage3", {"--csv=no"}, TEST_NO_LOAD, "--csv takes no value", 0},
    /* inputs beyond fp16, scores beyond what fp32 resolves */
    {"./stage3", {"--input-scale", "70000"}, TEST_NO_LOAD, "65504", 0},
    {"./stage3", {"--softmax-scale", "1e30"}, TEST_NO_LOAD, "2^22", 0},
    {"./stage3", {"--seqlen", "64", "--input-scale", "1000"}, TEST_NO_LOAD, "2^22", 0},
    /* a NaN in a loaded tensor; a shape flag that contradicts the loaded shape */
    {"./stage3", {""}, TEST_LOAD_K_NAN, "must be finite", 0},
    {"./stage3", {"--seqlen", "9"}, TEST_LOAD_GOOD, "--seqlen 9 contradicts --load", 0},
    {"./stage3", {"--dim", "64"}, TEST_LOAD_GOOD, "--dim 64 contradicts --load", 0},
    /* a byte count that would wrap around, one larger than any machine's memory */
    {"./stage3", {"--batch", "65536", "--heads", "65536", "--seqlen", "1048576", "--dim", "1024"}, TEST_NO_LOAD,
     "host memory", 0},
    {"./stage1", {"--batch", "4096", "--heads", "4096", "--seqlen", "65536"}, TEST_NO_LOAD, "host memory", 0},
    /* inputs of 20 MB, but stage 1's N x N scores are 4 TB: refused by the limits before its time
     * estimate and its allocation, not by the allocation after them */
    {"./stage1", {"--heads", "1", "--dim", "1", "--seqlen", "1000000"}, TEST_NO_LOAD, "host memory", 0},
    /* a --save directory that cannot be made: refused before the run */
    {"./stage3", {"--save", "/proc/no/such/dir"}, TEST_NO_LOAD, "--save", 1},
    /* flags a stage does not take: unknown, whatever the machine (no GPU needed to say so) */
    {"./stage3", {"--counters"}, TEST_NO_LOAD, "unknown option --counters", 0},
    {"./stage2", {"--flush-l2"}, TEST_NO_LOAD, "unknown option --flush-l2", 0},
    {"./stage1", {"--deterministic"}, TEST_NO_LOAD, "unknown option --deterministic", 0},
    {"./stage8", {"--deterministic"}, TEST_NO_LOAD, "unknown option --deterministic", 0},
    {"./stage10", {"--save", "/proc/no/such/dir"}, TEST_NO_LOAD, "--save", 1},
    {"./stage10", {"--counters"}, TEST_NO_LOAD, "unknown option --counters", 1},
    {"./stage9", {"--dim", "96"}, TEST_NO_LOAD, "32 64 128 256", 0},
    /* the KV cache: H a multiple of H_kv, causal queries the last N of N_kv >= N keys, and a stage
     * without a KV cache refusing one (from its descriptor, before any device is looked for) */
    {"./stage1", {"--heads", "6", "--kv-heads", "4"}, TEST_NO_LOAD, "multiple of --kv-heads", 0},
    {"./stage1", {"--kv-heads", "0"}, TEST_NO_LOAD, "--kv-heads 0", 0},
    {"./stage1", {"--kv-len", "0"}, TEST_NO_LOAD, "--kv-len 0", 0},
    {"./stage1", {"--kv-len", "-5"}, TEST_NO_LOAD, "--kv-len -5", 0},
    {"./stage1", {"--seqlen", "64", "--kv-len", "17", "--causal"}, TEST_NO_LOAD, "at least --seqlen", 0},
    {"./stage3", {"--kv-len", "100"}, TEST_NO_LOAD, "self-attention only", 0},
    {"./stage2", {"--heads", "4", "--kv-heads", "2"}, TEST_NO_LOAD, "self-attention only", 0},
    {"./stage9", {"--seqlen", "1", "--kv-len", "4096"}, TEST_NO_LOAD, "self-attention only", 0},
    {"./stage10", {"--heads", "8", "--kv-heads", "2"}, TEST_NO_LOAD, "self-attention only", 0},
    {"./stage1", {""}, TEST_LOAD_K_DIMS, "v.npy", 0}, /* a KV cache, but k.npy and v.npy disagree */
    {"./stage1", {"--kv-len", "9"}, TEST_LOAD_GOOD, "--kv-len 9 contradicts --load", 0},
    /* --splits: stage 15's alone, 1 to 1024 */
    {"./stage1", {"--splits", "2"}, TEST_NO_LOAD, "unknown option --splits", 0},
    {"./stage9", {"--splits", "2"}, TEST_NO_LOAD, "unknown option --splits", 0},
    {"./stage15", {"--splits", "0"}, TEST_NO_LOAD, "--splits 0", 0},
    {"./stage15", {"--splits", "1025"}, TEST_NO_LOAD, "--splits 1025", 0},
    {"./stage15", {"--splits", "two"}, TEST_NO_LOAD, "--splits two", 0},
    /* stage 15: written for generation, at most 64 queries; d = 64, 128; fp16, bf16; no counters */
    {"./stage15", {"--seqlen", "65"}, TEST_NO_LOAD, "at most 64", 0},
    {"./stage15", {"--dim", "256"}, TEST_NO_LOAD, "64 128", 0},
    {"./stage15", {"--dtype", "fp32"}, TEST_NO_LOAD, "fp32", 0},
    {"./stage15", {"--heads", "12"}, TEST_NO_LOAD, "multiple of --kv-heads", 0}, /* its default: 8 KV heads */
    {"./stage15", {"--counters"}, TEST_NO_LOAD, "unknown option --counters", 0},
    {"./stage15", {"--seqlen", "8", "--kv-len", "4", "--causal"}, TEST_NO_LOAD, "at least --seqlen", 0},
    /* --gpus, --transport: a multi-rank stage's (stage 20) alone; 1 to 64 ranks, nccl or copy */
    {"./stage20", {"--gpus", "0"}, TEST_NO_LOAD, "--gpus 0", 0},
    {"./stage20", {"--gpus", "65"}, TEST_NO_LOAD, "--gpus 65", 0},
    {"./stage20", {"--gpus", "two"}, TEST_NO_LOAD, "--gpus two", 0},
    {"./stage20", {"--transport", "mpi"}, TEST_NO_LOAD, "--transport mpi", 0},
    {"./stage20", {"--counters"}, TEST_NO_LOAD, "unknown option --counters", 0},
    {"./stage20", {"--kv-len", "100"}, TEST_NO_LOAD, "self-attention only", 0},
    {"./stage9", {"--gpus", "2"}, TEST_NO_LOAD, "unknown option --gpus", 0},
    {"./stage3", {"--transport", "copy"}, TEST_NO_LOAD, "unknown option --transport", 0},
};

ParameterizedTestParameters(cli, bad_usage_exits_2)
{
    size_t count = sizeof test_bad_cases / sizeof *test_bad_cases;
    struct test_bad_cli *p = cr_malloc(sizeof test_bad_cases);
    memcpy(p, test_bad_cases, sizeof test_bad_cases);
    return cr_make_param_array(struct test_bad_cli, p, count, test_free_params);
}

ParameterizedTest(struct test_bad_cli *c, cli, bad_usage_exits_2)
{
    char save[128], in[128], what[512];
    if (access(c->bin, X_OK) != 0) cr_skip_test("%s is not built here (a GPU stage needs nvcc)", c->bin);
    test_path(save, sizeof save, "save");
    test_path(in, sizeof in, "in");
    /* --save first, so that a flag missing its value is truly last */
    char *argv[16] = {c->bin, "--save", save};
    int k = c->no_save ? 1 : 3;
    if (c->load != TEST_NO_LOAD) {
        test_write_inputs(in, c->load);
        argv[k++] = "--load", argv[k++] = in;
    }
    for (int j = 0; j < 8 && c->args[j][0]; j++) argv[k++] = c->args[j];
    argv[k] = NULL;
    int w = snprintf(what, sizeof what, "%s", c->bin);
    for (int j = 1; j < k; j++) w += snprintf(what + w, sizeof what - w, " %s", argv[j]);

    struct test_proc p;
    test_spawn(argv, &p);
    test_assert_one_line_failure(&p, EXIT_USAGE, what, c->expect);
    cr_assert(access(save, F_OK) != 0 && errno == ENOENT, "%s: wrote %s although it failed", what, save);
}

/* ---- good command lines ---- */

Test(cli, help_shows_an_example)
{
    struct test_proc p;
    test_spawn((char *[]){"./stage1", "--help", NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage1 --help: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "usage:") && strstr(p.out, "example:"), "./stage1 --help: no usage or example:\n%s", p.out);
    cr_assert(p.err[0] == 0, "./stage1 --help wrote on stderr:\n%s", p.err);
}

/* --help lists what the stage itself takes: its dtypes, its head dims, its own flags. */
Test(cli, help_lists_what_the_stage_takes)
{
    static const struct {
        const char *bin, *has[3], *lacks[3];
    } cases[] = {
        {"./stage3", {"--dtype T          fp32 (", "any d >= 1", "--save"}, {"bf16", "--counters", "--flush-l2"}},
        {"./stage8", {"fp16 (default", "head dim: 64 or 128", "--counters"}, {"bf16", "--deterministic", "fp32"}},
        {"./stage9", {"fp16 or bf16", "32, 64, 128 or 256", "--load"}, {"--deterministic", "fp32", NULL}},
        {"./stage10", {"fp16 or bf16", "--deterministic", "do.npy dq.npy"}, {"--counters", "--dtype T          fp32", NULL}},
        {"./stage11", {"64, 128 or 256", "compute capability 9.0 only", "--counters"}, {"32, 64", "fp32", NULL}},
        {"./stage1", {"--kv-heads H_kv    KV heads, each shared", "--kv-len N_kv      keys and values: a KV cache",
                      "any d >= 1"}, {"--splits", "--counters", NULL}},
        /* the KV cache's flags: listed only where the stage has one (stages 1 and 15) */
        {"./stage3", {"--load", NULL, NULL}, {"--kv-len", "--kv-heads", "--splits"}},
        {"./stage9", {"--load", NULL, NULL}, {"--kv-len", "--kv-heads", "--splits"}},
        {"./stage15", {"--splits S", "queries per head, 1 to 64", "--kv-len N_kv      keys and values: a KV cache"},
         {"--counters", "fp32", "--deterministic"}},
    };
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        if (access(cases[k].bin, X_OK) != 0) continue; /* a GPU stage without nvcc */
        struct test_proc p;
        test_spawn((char *[]){(char *)cases[k].bin, "--help", NULL}, &p);
        cr_assert(p.code == EXIT_PASS, "%s --help: exit %d", cases[k].bin, p.code);
        for (int j = 0; j < 3; j++) {
            cr_assert(!cases[k].has[j] || strstr(p.out, cases[k].has[j]), "%s --help lacks '%s':\n%s", cases[k].bin,
                      cases[k].has[j], p.out);
            cr_assert(!cases[k].lacks[j] || !strstr(p.out, cases[k].lacks[j]), "%s --help offers '%s':\n%s",
                      cases[k].bin, cases[k].lacks[j], p.out);
        }
    }
}

#define TEST_CSV_HEADER \
    "stage,direction,gpu,dtype,batch,heads,seqlen,dim,causal,ms_median,ms_min,tflops,max_err,check,commit"

/* Field `k` (0-based) of a CSV line into buf. */
static void test_csv_field(const char *line, int k, char *buf, size_t n)
{
    for (; k > 0 && line; k--) line = strchr(line, ','), line = line ? line + 1 : NULL;
    size_t len = line ? strcspn(line, ",\n") : 0;
    snprintf(buf, n, "%.*s", (int)len, line ? line : "");
}

/* --outliers on a CPU stage: the inputs made, 4 channels of Q and K x50, checked as ever (the fp32
 * rule's score term grows with max|Q| max|K|), and the summary says so. The inputs saved with and
 * without it, same seed: in every row of Q and of K the OUTLIER_CHANNELS channels of outlier_channel
 * are 50 times the plain value (rounded to fp16, as add_outliers rounds them), every other channel
 * and all of V the same. */
Test(cli, outliers_run_and_pass)
{
    char dir[2][128], path[160], why[256];
    test_path(dir[0], sizeof dir[0], "outliers_x1");
    test_path(dir[1], sizeof dir[1], "outliers_x50");
    struct test_proc p;
    test_spawn((char *[]){"./stage3", "--seqlen", "64", "--heads", "2", "--save", dir[0], NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage3 --save: exit %d; stderr:\n%s", p.code, p.err);
    test_spawn((char *[]){"./stage3", "--seqlen", "64", "--heads", "2", "--outliers", "50", "--save", dir[1], NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage3 --outliers 50: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "outliers x50") && strstr(p.out, "check PASS"), "./stage3 --outliers 50: summary\n%s", p.out);
    const char *names[3] = {"q.npy", "k.npy", "v.npy"};
    for (int t = 0; t < 3; t++) {
        float *x[2];
        int dims[4];
        for (int s = 0; s < 2; s++) {
            snprintf(path, sizeof path, "%s/%s", dir[s], names[t]);
            x[s] = npy_read4(path, dims, why, sizeof why);
            cr_assert(x[s] != NULL, "%s", why);
        }
        const int d = dims[3];
        const size_t rows = (size_t)dims[0] * dims[1] * dims[2];
        int outlier[64] = {0};
        cr_assert(d == 64, "%s: d = %d, want the default 64", names[t], d);
        for (int k = 0; k < OUTLIER_CHANNELS && t < 2; k++) outlier[outlier_channel(k, d) % d] = 1;
        for (size_t r = 0; r < rows; r++)
            for (int c = 0; c < d; c++) {
                const double plain = x[0][r * d + c], got = x[1][r * d + c], want = outlier[c] ? 50 * plain : plain;
                /* fp16's rounding of 50 x: 2^-11 relative, 2^-25 absolute below its normals */
                const double tol = outlier[c] ? fabs(want) / 2048 + 1.0 / (1 << 25) : 0;
                cr_assert(fabs(got - want) <= tol, "%s row %zu channel %d: %g with --outliers 50, %g without (%s)",
                          names[t], r, c, got, plain, outlier[c] ? "an outlier channel" : "not an outlier channel");
            }
        free(x[0]), free(x[1]);
    }
}

Test(cli, csv_is_a_header_and_one_row)
{
    struct test_proc p;
    test_spawn((char *[]){"./stage2", "--csv", "--seqlen", "64", "--heads", "1", NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage2 --csv: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(test_count_lines(p.out) == 2, "./stage2 --csv: want exactly two lines, got:\n%s", p.out);
    const char *row = strchr(p.out, '\n') + 1;
    cr_assert(strncmp(p.out, TEST_CSV_HEADER, strlen(TEST_CSV_HEADER)) == 0, "./stage2 --csv: header is\n%s", p.out);
    cr_assert(strncmp(row, "stage2,fwd,cpu,fp32,", 20) == 0, "./stage2 --csv: row is\n%s", row);
    char check[16], seqlen[16];
    test_csv_field(row, 13, check, sizeof check);
    test_csv_field(row, 6, seqlen, sizeof seqlen);
    cr_assert(!strcmp(check, "pass") && !strcmp(seqlen, "64"), "./stage2 --csv: check '%s' seqlen '%s' in\n%s",
              check, seqlen, row);
}

/* The CSV row names the KV cache: kv_len and kv_heads after the columns every stage prints, and
 * splits (empty: stage 1 does not split the keys). */
Test(cli, csv_names_the_kv_cache)
{
    struct test_proc p;
    test_spawn((char *[]){"./stage1", "--csv", "--seqlen", "4", "--kv-len", "33", "--heads", "4", "--kv-heads", "2",
                          "--dim", "16", "--causal", NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage1 --csv --kv-len 33: exit %d; stderr:\n%s", p.code, p.err);
    const char *row = strchr(p.out, '\n') + 1;
    cr_assert(strstr(p.out, ",kv_len,kv_heads,splits\n") != NULL, "header without the KV columns:\n%s", p.out);
    char kv_len[16], kv_heads[16], splits[16], check[16];
    test_csv_field(row, 17, kv_len, sizeof kv_len);
    test_csv_field(row, 18, kv_heads, sizeof kv_heads);
    test_csv_field(row, 19, splits, sizeof splits);
    test_csv_field(row, 13, check, sizeof check);
    cr_assert(!strcmp(kv_len, "33") && !strcmp(kv_heads, "2") && !strcmp(splits, "") && !strcmp(check, "pass"),
              "kv_len '%s' kv_heads '%s' splits '%s' check '%s' in\n%s", kv_len, kv_heads, splits, check, row);
}

/* A KV cache through --save and --load: k.npy and v.npy are [B, H_kv, N_kv, d], and stage 1 loads
 * them back to the same shape and the same answer. */
Test(cli, kv_cache_save_then_load)
{
    char a[128], b[128], path[160], why[256];
    test_path(a, sizeof a, "kv_first");
    test_path(b, sizeof b, "kv_second");
    struct test_proc p;
    test_spawn((char *[]){"./stage1", "--batch", "2", "--heads", "6", "--kv-heads", "2", "--seqlen", "3", "--kv-len",
                          "50", "--dim", "16", "--causal", "--save", a, NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage1 --save: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "stage1  B=2 H=6 Hkv=2 N=3 Nkv=50 d=16 causal"), "summary is\n%s", p.out);
    test_spawn((char *[]){"./stage1", "--load", a, "--causal", "--save", b, NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage1 --load: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "stage1  B=2 H=6 Hkv=2 N=3 Nkv=50 d=16 causal") && strstr(p.out, "check PASS"),
              "./stage1 --load: summary is\n%s", p.out);
    const char *names[4] = {"q.npy", "k.npy", "v.npy", "o.npy"};
    const int want[4][4] = {{2, 6, 3, 16}, {2, 2, 50, 16}, {2, 2, 50, 16}, {2, 6, 3, 16}};
    for (int j = 0; j < 4; j++) {
        float *x[2];
        int dims[2][4];
        for (int s = 0; s < 2; s++) {
            snprintf(path, sizeof path, "%s/%s", s ? b : a, names[j]);
            x[s] = npy_read4(path, dims[s], why, sizeof why);
            cr_assert(x[s] != NULL, "%s", why);
            cr_assert(!memcmp(dims[s], want[j], sizeof want[j]), "%s is [%d, %d, %d, %d], want [%d, %d, %d, %d]", path,
                      dims[s][0], dims[s][1], dims[s][2], dims[s][3], want[j][0], want[j][1], want[j][2], want[j][3]);
        }
        const size_t n = (size_t)want[j][0] * want[j][1] * want[j][2] * want[j][3];
        cr_assert(!memcmp(x[0], x[1], n * sizeof(float)), "%s differs after --load and --save", names[j]);
        free(x[0]), free(x[1]);
    }
}

/* Stage 15 with no arguments: the benchmark's decode step, checked, where there is a GPU; exit 3 with one
 * line where there is none. */
Test(cli, stage15_default_run)
{
    char why[256];
    if (access("./stage15", X_OK) != 0) cr_skip_test("./stage15 is not built here (a GPU stage needs nvcc)");
    struct test_proc p;
    test_spawn((char *[]){"./stage15", "--iters", "2", NULL}, &p);
    if (!gpu_available || gpu_available(why, sizeof why)) {
        test_assert_one_line_failure(&p, EXIT_NO_DEVICE, "./stage15", NULL);
        return;
    }
    cr_assert(p.code == EXIT_PASS, "./stage15: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "B=8 H=32 Hkv=8 N=1 Nkv=16384 d=128") && strstr(p.out, "GB/s of K, V") &&
              strstr(p.out, "check PASS"), "./stage15: summary is\n%s", p.out);
}

/* Stage 1 saves its inputs and outputs; stage 3 loads those inputs (the shape comes from the
 * files; --causal is given again), passes its own check, and saves the same inputs and an O
 * within the rule's allowance of stage 1's (twice the fp32 tolerance: both carry rounding). */
Test(cli, save_then_load_round_trip)
{
    char a[128], b[128], path[160], why[256];
    test_path(a, sizeof a, "from_stage1");
    test_path(b, sizeof b, "from_stage3");
    struct test_proc p;
    test_spawn((char *[]){"./stage1", "--batch", "2", "--heads", "3", "--seqlen", "33", "--dim", "16", "--causal",
                          "--save", a, NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage1 --save: exit %d; stderr:\n%s", p.code, p.err);
    test_spawn((char *[]){"./stage3", "--load", a, "--causal", "--save", b, NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage3 --load: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "stage3  B=2 H=3 N=33 d=16 causal") && strstr(p.out, "check PASS"),
              "./stage3 --load: summary is\n%s", p.out);

    float *t[2][4]; /* [from stage 1, from stage 3][q, k, v, o] */
    int dims[2][4][4];
    const char *names[4] = {"q.npy", "k.npy", "v.npy", "o.npy"};
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 4; j++) {
            snprintf(path, sizeof path, "%s/%s", s ? b : a, names[j]);
            t[s][j] = npy_read4(path, dims[s][j], why, sizeof why);
            cr_assert(t[s][j] != NULL, "%s", why);
            cr_assert(!memcmp(dims[s][j], dims[0][0], sizeof dims[0][0]), "%s has another shape", path);
        }
    struct shape sh = test_shape(2, 3, 33, 16, 1);
    cr_assert(!memcmp(dims[0][0], ((int[4]){2, 3, 33, 16}), sizeof dims[0][0]), "q.npy is not [2, 3, 33, 16]");
    size_t n = shape_elems(&sh);
    for (int j = 0; j < 3; j++)
        cr_assert(!memcmp(t[0][j], t[1][j], n * sizeof(float)), "%s changed on its way through --load and --save",
                  names[j]);
    double qmax = max_abs(t[0][0], n), kmax = max_abs(t[0][1], n), vmax = max_abs(t[0][2], n);
    double *want = test_widen(t[0][3], n);
    struct cmp c = compare(t[1][3], want, n, 2 * tol_output(&sh, DT_F32, qmax, kmax, vmax));
    TEST_ASSERT_CMP("stage3 o.npy vs stage1 o.npy", "O", c, &sh, 0);
    free(want);
    for (int s = 0; s < 2; s++)
        for (int j = 0; j < 4; j++) free(t[s][j]);
}

/* A GPU stage's binary: exit 3 with one line where there is no device, a passing run where there is. */
Test(cli, gpu_stage_without_a_device_exits_3)
{
    const struct stage *gpu = NULL;
    for (int s = 0; s < n_all_stages && !gpu; s++)
        if (all_stages[s]->device == ON_GPU) gpu = all_stages[s];
    if (!gpu || !gpu_available) cr_skip_test("built without CUDA: no GPU stage binary");
    char bin[32], save[128], why[256];
    snprintf(bin, sizeof bin, "./%s", gpu->name);
    test_path(save, sizeof save, "save");
    struct test_proc p;
    test_spawn((char *[]){bin, "--seqlen", "64", "--batch", "1", "--heads", "2", "--save", save, NULL}, &p);
    if (gpu_available(why, sizeof why)) {
        test_assert_one_line_failure(&p, EXIT_NO_DEVICE, bin, NULL);
        cr_assert(access(save, F_OK) != 0, "%s wrote %s without a device", bin, save);
    } else {
        cr_assert(p.code == EXIT_PASS, "%s --seqlen 64: exit %d on a machine with a GPU; stderr:\n%s", bin, p.code,
                  p.err);
    }
}

/* A stage built for one architecture (the Hopper stages, sm_90a) on any other machine: exit 3 with
 * one line, which names what it needs where there is a GPU of another kind. */
Test(cli, arch_stage_elsewhere_exits_3)
{
    const struct stage *st = NULL;
    for (int s = 0; s < n_all_stages && !st; s++)
        if (all_stages[s]->arch_sm) st = all_stages[s];
    if (!st) cr_skip_test("no stage in this build is built for one architecture only");
    if (!gpu_available) cr_skip_test("built without CUDA: no GPU stage binary");
    char bin[32], save[128], why[256];
    const int no_device = gpu_available(why, sizeof why) != 0;
    if (!no_device && !gpu_arch_check(st->arch_sm, st->name, why, sizeof why))
        cr_skip_test("this GPU is the one %s is built for: it runs (stages::vs_stage1 checks it)", st->name);
    snprintf(bin, sizeof bin, "./%s", st->name);
    if (access(bin, X_OK) != 0) cr_skip_test("%s is not built here", bin);
    test_path(save, sizeof save, "save");
    struct test_proc p;
    test_spawn((char *[]){bin, "--seqlen", "64", "--batch", "1", "--heads", "2", "--save", save, NULL}, &p);
    test_assert_one_line_failure(&p, EXIT_NO_DEVICE, bin, no_device ? NULL : "needs a");
    cr_assert(access(save, F_OK) != 0, "%s wrote %s on a machine it cannot run on", bin, save);
}

/* The backward's --save and --load: stage 10 saves its inputs, dO and gradients; a second run
 * loads q, k, v and do from there and, with --deterministic on both sides (the same bits every
 * run), saves the very same gradients. At d = 32, whose --deterministic dQ kernel (49
 * KiB) fits a T4's 64 KiB too; skipped with the stage's own line where the device allows less. */
Test(cli, backward_save_then_load_round_trip)
{
    char why[256], a[128], b[128], path[160];
    if (access("./stage10", X_OK) != 0) cr_skip_test("./stage10 is not built here (a GPU stage needs nvcc)");
    test_require_gpu();
    const struct shape sh = test_shape(1, 3, 70, 32, 1);
    test_require_fit(test_find_stage("stage10"), &sh, DT_F16, 1, 1);
    test_path(a, sizeof a, "bwd_first");
    test_path(b, sizeof b, "bwd_second");
    struct test_proc p;
    test_spawn((char *[]){"./stage10", "--batch", "1", "--heads", "3", "--seqlen", "70", "--dim", "32", "--causal",
                          "--deterministic", "--save", a, NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage10 --save: exit %d; stderr:\n%s", p.code, p.err);
    test_spawn((char *[]){"./stage10", "--load", a, "--causal", "--deterministic", "--save", b, NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage10 --load: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "stage10 B=1 H=3 N=70 d=32 causal"), "./stage10 --load: summary is\n%s", p.out);
    const char *names[8] = {"q.npy", "k.npy", "v.npy", "do.npy", "o.npy", "dq.npy", "dk.npy", "dv.npy"};
    for (int j = 0; j < 8; j++) {
        float *x[2];
        int dims[2][4];
        for (int s = 0; s < 2; s++) {
            snprintf(path, sizeof path, "%s/%s", s ? b : a, names[j]);
            x[s] = npy_read4(path, dims[s], why, sizeof why);
            cr_assert(x[s] != NULL, "%s", why);
        }
        cr_assert(!memcmp(dims[0], ((int[4]){1, 3, 70, 32}), sizeof dims[0]) && !memcmp(dims[0], dims[1], sizeof dims[0]),
                  "%s is not [1, 3, 70, 32] in both runs", names[j]);
        cr_assert(!memcmp(x[0], x[1], shape_elems(&sh) * sizeof(float)), "%s differs between the saving run and "
                  "the run that loaded its inputs", names[j]);
        free(x[0]), free(x[1]);
    }
}

/* ---- the shared-memory cap (ATTN_SMEM_CAP_KB) and Turing's dtypes ---- */

/* A cap that is not a whole number of KiB from 1 on: exit 2 with one line naming the variable,
 * before any device is looked for (so on any machine), and nothing written. GPU stages say in
 * --help that the variable exists. */
Test(cli, smem_cap_bad_value_exits_2)
{
    if (access("./stage9", X_OK) != 0) cr_skip_test("./stage9 is not built here (a GPU stage needs nvcc)");
    struct test_proc p;
    test_spawn((char *[]){"./stage9", "--help", NULL}, &p);
    cr_assert(p.code == EXIT_PASS && strstr(p.out, "ATTN_SMEM_CAP_KB=K"), "./stage9 --help does not name "
              "ATTN_SMEM_CAP_KB:\n%s", p.out);
    static const char *bad[] = {"abc", "0", "-64", "64k", "99.5"};
    char save[128], what[96];
    test_path(save, sizeof save, "save");
    for (size_t k = 0; k < TEST_COUNT(bad); k++) {
        setenv("ATTN_SMEM_CAP_KB", bad[k], 1);
        snprintf(what, sizeof what, "ATTN_SMEM_CAP_KB=%s ./stage9", bad[k]);
        test_spawn((char *[]){"./stage9", "--seqlen", "64", "--save", save, NULL}, &p);
        test_assert_one_line_failure(&p, EXIT_USAGE, what, "ATTN_SMEM_CAP_KB");
        cr_assert(access(save, F_OK) != 0, "%s wrote %s", what, save);
    }
}

/* Under a cap a stage takes the smaller tiles it lists, and says so in the summary; below its
 * smallest tiles it exits 2 with one line. Needs a GPU (the stage runs). */
Test(cli, smem_cap_picks_smaller_tiles)
{
    if (access("./stage9", X_OK) != 0 || access("./stage10", X_OK) != 0) cr_skip_test("./stage9, ./stage10 not built here");
    test_require_gpu();
    struct test_proc p;
    setenv("ATTN_SMEM_CAP_KB", "99", 1);
    test_spawn((char *[]){"./stage9", "--dim", "256", "--seqlen", "100", "--batch", "1", "--heads", "2", NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "ATTN_SMEM_CAP_KB=99 ./stage9 --dim 256: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "tiles Br=64 Bc=32 Bs=32") && strstr(p.out, "(ATTN_SMEM_CAP_KB=99)"),
              "ATTN_SMEM_CAP_KB=99 ./stage9 --dim 256: the summary does not name the 99 KiB tiles:\n%s", p.out);
    /* the backward has no tiles of 99 KiB or less at d = 256 */
    test_spawn((char *[]){"./stage10", "--dim", "256", "--seqlen", "100", "--batch", "1", "--heads", "2", NULL}, &p);
    test_assert_one_line_failure(&p, EXIT_USAGE, "ATTN_SMEM_CAP_KB=99 ./stage10 --dim 256", "needs at least");
    setenv("ATTN_SMEM_CAP_KB", "16", 1);
    test_spawn((char *[]){"./stage9", "--dim", "256", "--seqlen", "100", NULL}, &p);
    test_assert_one_line_failure(&p, EXIT_USAGE, "ATTN_SMEM_CAP_KB=16 ./stage9 --dim 256", "needs at least 64.0 KiB");
}

/* Stage 15 where a block may have 64 KiB (a T4): the ring of two K/V stages, named in the summary,
 * with the most slices its merge takes (512: their weights over the ring) and the check passing;
 * one more is refused with one line. Needs a GPU. */
Test(cli, stage15_at_64_kib)
{
    if (access("./stage15", X_OK) != 0) cr_skip_test("./stage15 is not built here (a GPU stage needs nvcc)");
    test_require_gpu();
    setenv("ATTN_SMEM_CAP_KB", "64", 1);
    struct test_proc p;
    test_spawn((char *[]){"./stage15", "--batch", "1", "--heads", "8", "--kv-heads", "2", "--kv-len", "5000", "--dim", "128",
                          "--splits", "512", "--iters", "2", NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "ATTN_SMEM_CAP_KB=64 ./stage15 --splits 512: exit %d; stderr:\n%s", p.code, p.err);
    cr_assert(strstr(p.out, "tiles Br=16 Bc=64, 2 K/V stages, 64.0 of 64 KiB") && strstr(p.out, "check PASS"),
              "ATTN_SMEM_CAP_KB=64 ./stage15 --splits 512: the summary does not name the 64 KiB tiles and a pass:\n%s", p.out);
    test_spawn((char *[]){"./stage15", "--kv-len", "5000", "--splits", "513", NULL}, &p);
    test_assert_one_line_failure(&p, EXIT_USAGE, "ATTN_SMEM_CAP_KB=64 ./stage15 --splits 513", "at most 512 slices");
}

/* Where the code running on the GPU is Turing's (a T4, or a build of compute_75 PTX on any GPU),
 * bf16 exits 2 with one line; fp16 runs. */
Test(cli, bf16_on_turing_code_exits_2)
{
    char why[256];
    if (access("./stage9", X_OK) != 0) cr_skip_test("./stage9 is not built here (a GPU stage needs nvcc)");
    test_require_gpu();
    if (!gpu_dtype_check(DT_BF16, "stage9", why, sizeof why))
        cr_skip_test("the code running on this GPU is sm_%d's: it takes bf16", gpu_code_arch());
    struct test_proc p;
    test_spawn((char *[]){"./stage9", "--dtype", "bf16", "--seqlen", "64", NULL}, &p);
    test_assert_one_line_failure(&p, EXIT_USAGE, "./stage9 --dtype bf16 on Turing's code", "bf16");
    test_spawn((char *[]){"./stage9", "--seqlen", "64", "--batch", "1", "--heads", "2", NULL}, &p);
    cr_assert(p.code == EXIT_PASS, "./stage9 (fp16) on Turing's code: exit %d; stderr:\n%s", p.code, p.err);
}
