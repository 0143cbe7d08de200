/* cli.c: the one command line every stage takes. Bad input exits 2 with a one-line reason,
 * before any device is looked for. A stage is offered (and accepts) only the options that apply
 * to it: the table below says which. --kv-len and --kv-heads are the exception: --help lists them
 * only for a stage with a KV cache (its descriptor's kv_cache), but every stage reads them, so that
 * a self-attention stage given a KV cache says in its one line that it is self-attention only. */
#include "fp8.h"
#include "harness.h"
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- which options a stage takes ---- */

enum takes { ANY_STAGE, GPU_STAGE, GPU_FORWARD, BACKWARD, SPLIT_KV, FP8_STAGE, MULTI_RANK };

/* --splits S: at most this many slices of the keys (a split-KV stage's own rule picks a few per SM;
 * more than the keys' tiles leaves some slices empty, which the merge weighs at zero) */
#define MAX_SPLITS 1024
/* --gpus P: at most this many ranks (a host has 8 or 16 GPUs; more, simulated on one GPU by the
 * copy transport, only cuts each rank's part thinner) */
#define MAX_RANKS 64

static int stage_takes(const struct stage *st, enum takes t)
{
    switch (t) {
    case ANY_STAGE: return 1;
    case GPU_STAGE: return st->device == ON_GPU;
    /* its kernel has a counting build (a split-KV stage's kernels have none, nor a multi-rank one) */
    case GPU_FORWARD: return st->device == ON_GPU && !st->measures_backward && !st->kv_splits && !st->ranks;
    case BACKWARD: return st->measures_backward;
    case SPLIT_KV: return st->kv_splits != NULL;
    case FP8_STAGE: return (st->dtypes & DT_FP8) != 0; /* --hadamard: how it quantizes */
    case MULTI_RANK: return st->ranks != NULL;         /* --gpus, --transport: its ranks */
    }
    return 0;
}

static const struct option_def {
    const char *name;
    int has_value;
    enum takes takes;
} options[] = {
    {"--batch", 1, ANY_STAGE},       {"--heads", 1, ANY_STAGE},         {"--seqlen", 1, ANY_STAGE},
    {"--dim", 1, ANY_STAGE},         {"--causal", 0, ANY_STAGE},        {"--dtype", 1, ANY_STAGE},
    {"--softmax-scale", 1, ANY_STAGE}, {"--input-scale", 1, ANY_STAGE}, {"--seed", 1, ANY_STAGE},
    {"--warmup", 1, ANY_STAGE},      {"--iters", 1, ANY_STAGE},         {"--no-check", 0, ANY_STAGE},
    {"--csv", 0, ANY_STAGE},         {"--csv-row", 0, ANY_STAGE},       {"--flush-l2", 0, GPU_STAGE},
    {"--counters", 0, GPU_FORWARD},  {"--deterministic", 0, BACKWARD},  {"--load", 1, ANY_STAGE},
    {"--save", 1, ANY_STAGE},          {"--help", 0, ANY_STAGE},          {"-h", 0, ANY_STAGE},
    {"--kv-len", 1, ANY_STAGE},      {"--kv-heads", 1, ANY_STAGE},      {"--splits", 1, SPLIT_KV},
    {"--outliers", 1, ANY_STAGE},    {"--hadamard", 1, FP8_STAGE},
    {"--gpus", 1, MULTI_RANK},       {"--transport", 1, MULTI_RANK},
};

static const struct option_def *find_option(const struct stage *st, const char *name)
{
    for (size_t k = 0; k < sizeof options / sizeof *options; k++)
        if (!strcmp(options[k].name, name)) return stage_takes(st, options[k].takes) ? &options[k] : NULL;
    return NULL;
}

/* ---- --help ---- */

/* "fp16 or bf16", "64 or 128", "32, 64, 128 or 256": a list in words. */
static void list_words(char *buf, size_t n, const char *const *items, int count)
{
    size_t k = 0;
    buf[0] = 0;
    for (int j = 0; j < count && k < n; j++)
        k += snprintf(buf + k, n - k, "%s%s", j == 0 ? "" : j == count - 1 ? " or " : ", ", items[j]);
}

static void usage(const struct stage *st, const struct opts *def, FILE *f)
{
    char dtypes[64], dims[96], dim_strs[8][8], seqlen[96];
    if (st->max_seqlen)
        snprintf(seqlen, sizeof seqlen, "queries per head, 1 to %d", st->max_seqlen);
    else
        snprintf(seqlen, sizeof seqlen, "sequence length, any N >= 1");
    const char *items[8];
    int count = 0;
    for (unsigned bit = DT_F32; bit <= DT_LAST; bit <<= 1)
        if (st->dtypes & bit) items[count++] = dtype_name((enum dtype)bit);
    list_words(dtypes, sizeof dtypes, items, count);
    if (st->dims[0] == 0) {
        snprintf(dims, sizeof dims, "any d >= 1");
    } else {
        for (count = 0; count < 8 && st->dims[count]; count++) {
            snprintf(dim_strs[count], sizeof dim_strs[count], "%d", st->dims[count]);
            items[count] = dim_strs[count];
        }
        list_words(dims, sizeof dims, items, count);
    }
    fprintf(f,
            "%s: %s\n"
            "usage: ./%s [options]\n"
            "  --batch B          batch size (default %d)\n"
            "  --heads H          heads (default %d)\n"
            "  --seqlen N         %s (default %d)\n"
            "  --dim d            head dim: %s (default %d)\n"
            "  --causal           %s\n"
            "  --dtype T          %s (default %s)\n"
            "  --softmax-scale s  softmax scale (default 1/sqrt(d))\n"
            "  --input-scale a    inputs drawn uniformly from [-a, a] (default 1)\n"
            "  --outliers F       %d channels of Q and K multiplied by F in every row, the outlier\n"
            "                     features of real models (F >= 1; default 1: none)\n"
            "  --seed S           input seed (default %llu)\n"
            "  --warmup W         untimed runs first (default %d)\n"
            "  --iters I          timed runs; median and minimum reported (default %d)\n"
            "  --no-check         skip the check against the reference\n"
            "  --csv              print a CSV header and row instead of the summary\n"
            "  --csv-row          print the CSV row alone\n",
            st->name, st->idea, st->name, def->sh.B, def->sh.H, seqlen, def->sh.N, dims, def->sh.d,
            st->kv_cache ? "query i sees the keys up to its position, N_kv - N + i (N = N_kv: keys 0..i)"
                         : "query i sees keys 0..i only",
            dtypes, dtype_name(def->dtype), OUTLIER_CHANNELS, (unsigned long long)def->seed, def->warmup, def->iters);
    if (st->kv_cache) {
        char nkv[16] = "N", hkv[16] = "H";
        if (def->sh.N_kv) snprintf(nkv, sizeof nkv, "%d", def->sh.N_kv);
        if (def->sh.H_kv) snprintf(hkv, sizeof hkv, "%d", def->sh.H_kv);
        fprintf(f, "  --kv-len N_kv      keys and values: a KV cache of N_kv positions, any N_kv >= 1 (default %s);\n"
                   "                     the N queries are its last N positions\n"
                   "  --kv-heads H_kv    KV heads, each shared by H / H_kv consecutive query heads (grouped-query\n"
                   "                     attention; 1: multi-query); H a multiple of H_kv (default %s)\n",
                nkv, hkv);
    }
    if (stage_takes(st, SPLIT_KV))
        fprintf(f, "  --splits S         cut each KV head's keys into S slices, merged by their logsumexp\n"
                   "                     (1 to %d; default: the stage's rule, from the shape and the SM count)\n",
                MAX_SPLITS);
    if (stage_takes(st, FP8_STAGE))
        fprintf(f, "  --hadamard 0|1     fp8: multiply Q and K by a random-sign Hadamard matrix before quantizing\n"
                   "                     (incoherent processing; default 1)\n");
    if (stage_takes(st, MULTI_RANK))
        fprintf(f, "  --gpus P           ranks, each holding 1/P of Q, K and V (1 to %d; default: one per visible GPU)\n"
                   "  --transport T      how a K/V block goes to the next rank: nccl (each rank a GPU of its own,\n"
                   "                     P <= GPUs) or copy (device-to-device copies: every rank on GPU 0);\n"
                   "                     default nccl where P <= GPUs, else copy\n", MAX_RANKS);
    if (stage_takes(st, GPU_STAGE)) fprintf(f, "  --flush-l2         empty the L2 cache (read a buffer twice its size) before every timed run\n");
    if (stage_takes(st, GPU_FORWARD))
        fprintf(f, "  --counters         run the kernel's counting build once more and print the work on O\n"
                   "                     it counted, beside the HBM bytes its loop structure moves\n");
    if (stage_takes(st, BACKWARD))
        fprintf(f, "  --deterministic    bitwise-identical dQ from run to run (slower)\n");
    if (st->kv_cache)
        fprintf(f, "  --load DIR         read q.npy [B, H, N, d] and k.npy, v.npy [B, H_kv, N_kv, d] (float32 or\n"
                   "                     float16) from DIR; the shape is theirs (shape flags, if given, must agree)\n");
    else
        fprintf(f, "  --load DIR         read q.npy k.npy v.npy%s ([B, H, N, d], float32 or float16) from DIR;\n"
                   "                     the shape is theirs (shape flags, if given, must agree)\n",
                st->measures_backward ? " and do.npy if there" : "");
    fprintf(f, "  --save DIR         write q.npy k.npy v.npy o.npy lse.npy%s (float32) into DIR\n",
            st->measures_backward ? " do.npy dq.npy dk.npy dv.npy" : "");
    fprintf(f, "  --help             this text\n");
    if (stage_takes(st, GPU_STAGE))
        fprintf(f, "environment: ATTN_SMEM_CAP_KB=K  use at most K KiB of shared memory per block, as a GPU with\n"
                   "                     less would (99: RTX 30/40/50 cards, 64: T4); the summary names the tiles chosen\n");
    if (st->arch_sm)
        fprintf(f, "runs on GPUs of compute capability %d.%d only (built for sm_%da); elsewhere it exits 3\n",
                st->arch_sm / 10, st->arch_sm % 10, st->arch_sm);
    fprintf(f,
            "exit codes: 0 checked and passed, 1 check failed, 2 bad usage or unsupported shape,\n"
            "            3 no usable GPU for this stage, 4 a CUDA error at run time\n");
    if (st->max_seqlen) /* a decoder: one generation step, a query per head against the cache */
        fprintf(f, "example: ./%s --batch 1 --heads 32 --kv-heads 8 --seqlen 1 --kv-len 65536 --dim %d\n", st->name,
                def->sh.d);
    else
        fprintf(f, "example: ./%s --batch 2 --heads 8 --seqlen %d --dim %d --causal\n", st->name,
                st->device == ON_GPU ? 4096 : 1024, def->sh.d);
}

static void defaults(const struct stage *st, struct opts *o)
{
    memset(o, 0, sizeof *o);
    int gpu = st->device == ON_GPU;
    /* CPU defaults finish in about a second on two cores even for stage 1; the GPU default
     * is big enough (4 x 16 heads of 4096) to fill the device */
    o->sh = (struct shape){.B = gpu ? 4 : 1, .H = gpu ? 16 : 4, .N = gpu ? 4096 : 1024, .d = 64, .causal = 0, .scale = 0};
    if (st->dims[0] != 0) { /* a stage without d = 64 defaults to its first head dim */
        int has64 = 0;
        for (int k = 0; k < 8 && st->dims[k]; k++) has64 |= st->dims[k] == 64;
        if (!has64) o->sh.d = st->dims[0];
    }
    if (st->max_seqlen) {
        /* a stage written for generation: one step of a decoder, a query per head (N = 1) against a
         * 16k cache, 32 query heads over 8 KV heads of 128 (the shape make bench-decode measures) */
        o->sh.B = 8, o->sh.H = 32, o->sh.N = 1, o->sh.N_kv = 16384, o->sh.H_kv = 8;
        if (st->dims[0] == 0 || st->dims[0] == 128 || st->dims[1] == 128) o->sh.d = 128;
    }
    o->dtype = gpu ? DT_F16 : DT_F32;
    if (!(st->dtypes & o->dtype)) /* a stage without it (the FP8 stage): its first dtype */
        for (unsigned bit = DT_LAST; bit >= DT_F32; bit >>= 1)
            if (st->dtypes & bit) o->dtype = (enum dtype)bit;
    o->seed = 1234;
    o->input_scale = 1.0f;
    o->outliers = 1.0f;
    o->hadamard = -1; /* not given: 1 for fp8 (below) */
    o->warmup = gpu ? 3 : 1;
    o->iters = gpu ? 20 : 3;
    o->check = 1;
}

/* One line on stderr saying what is wrong; the usage exit code. */
static int bad(const struct stage *st, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", st->name);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see --help)\n");
    va_end(ap);
    return EXIT_USAGE;
}

/* A whole integer in [lo, max]. */
static int parse_int(const char *s, long lo, long max, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > max) return 1;
    *out = (int)v;
    return 0;
}

int parse_opts(const struct stage *st, int argc, char **argv, struct opts *o, int *done)
{
    struct opts def;
    defaults(st, &def);
    *o = def;
    *done = 0;
    float softmax_scale = 0;
    for (int k = 1; k < argc; k++) {
        char *arg = argv[k], *val = NULL;
        char name[64];
        snprintf(name, sizeof name, "%s", arg);
        char *eq = strchr(name, '=');
        if (eq) { *eq = 0; val = arg + (eq - name) + 1; }
        const struct option_def *opt = find_option(st, name);
        if (!opt) return bad(st, "unknown option %s", name);
        if (!opt->has_value) {
            if (val) return bad(st, "%s takes no value (got %s)", name, arg);
            if (!strcmp(name, "--help") || !strcmp(name, "-h")) { usage(st, &def, stdout); *done = 1; return EXIT_PASS; }
            if (!strcmp(name, "--causal")) o->sh.causal = 1;
            else if (!strcmp(name, "--no-check")) o->check = 0;
            else if (!strcmp(name, "--csv")) o->csv = 1;
            else if (!strcmp(name, "--csv-row")) o->csv = o->csv_no_header = 1;
            else if (!strcmp(name, "--flush-l2")) o->flush_l2 = 1;
            else if (!strcmp(name, "--counters")) o->counters = 1;
            else if (!strcmp(name, "--deterministic")) o->deterministic = 1;
            continue;
        }
        if (!val) {
            if (k + 1 >= argc) return bad(st, "%s needs a value", name);
            val = argv[++k];
        }
        int err = 0;
        if (!strcmp(name, "--batch")) err = parse_int(val, 1, 1 << 16, &o->sh.B), o->shape_given |= SHAPE_GIVEN_B;
        else if (!strcmp(name, "--heads")) err = parse_int(val, 1, 1 << 16, &o->sh.H), o->shape_given |= SHAPE_GIVEN_H;
        else if (!strcmp(name, "--seqlen")) err = parse_int(val, 1, 1 << 20, &o->sh.N), o->shape_given |= SHAPE_GIVEN_N;
        else if (!strcmp(name, "--dim")) err = parse_int(val, 1, 1024, &o->sh.d), o->shape_given |= SHAPE_GIVEN_D;
        else if (!strcmp(name, "--kv-len")) err = parse_int(val, 1, 1 << 24, &o->sh.N_kv), o->shape_given |= SHAPE_GIVEN_NKV;
        else if (!strcmp(name, "--kv-heads")) err = parse_int(val, 1, 1 << 16, &o->sh.H_kv), o->shape_given |= SHAPE_GIVEN_HKV;
        else if (!strcmp(name, "--splits")) err = parse_int(val, 1, MAX_SPLITS, &o->sh.splits);
        else if (!strcmp(name, "--gpus")) {
            if (parse_int(val, 1, MAX_RANKS, &o->gpus))
                return bad(st, "--gpus %s: expected a number of ranks from 1 to %d", val, MAX_RANKS);
        } else if (!strcmp(name, "--transport")) {
            if (!strcmp(val, "nccl")) o->transport = TRANSPORT_NCCL;
            else if (!strcmp(val, "copy")) o->transport = TRANSPORT_COPY;
            else return bad(st, "--transport %s: expected nccl or copy", val);
        }
        else if (!strcmp(name, "--warmup")) err = parse_int(val, 0, 1000000, &o->warmup);
        else if (!strcmp(name, "--iters")) err = parse_int(val, 1, 1000000, &o->iters);
        else if (!strcmp(name, "--seed")) {
            char *end;
            errno = 0;
            unsigned long long v = strtoull(val, &end, 10);
            err = errno || end == val || *end || val[0] == '-';
            o->seed = v;
        } else if (!strcmp(name, "--dtype")) {
            if (!strcmp(val, "fp32")) o->dtype = DT_F32;
            else if (!strcmp(val, "fp16")) o->dtype = DT_F16;
            else if (!strcmp(val, "bf16")) o->dtype = DT_BF16;
            else if (!strcmp(val, "fp8")) o->dtype = DT_FP8;
            else return bad(st, "--dtype %s: expected fp32, fp16, bf16 or fp8", val);
        } else if (!strcmp(name, "--hadamard")) {
            err = parse_int(val, 0, 1, &o->hadamard);
        } else if (!strcmp(name, "--outliers")) {
            char *end;
            errno = 0;
            float v = strtof(val, &end);
            err = errno || end == val || *end || !(v >= 1.0f) || !isfinite(v);
            if (err) return bad(st, "--outliers %s: expected a factor F >= 1 (1: no outliers)", val);
            o->outliers = v;
        } else if (!strcmp(name, "--softmax-scale") || !strcmp(name, "--input-scale")) {
            char *end;
            errno = 0;
            float v = strtof(val, &end);
            err = errno || end == val || *end || !(v > 0) || !isfinite(v);
            if (name[2] == 's') softmax_scale = v; else o->input_scale = v;
        } else if (!strcmp(name, "--load")) o->load_dir = val;
        else if (!strcmp(name, "--save")) o->save_dir = val;
        if (err) return bad(st, "%s %s: not a valid value for this option", name, val);
    }
    /* the KV cache not given: the stage's default, else the queries' own (self-attention) */
    if (!o->sh.N_kv) o->sh.N_kv = o->sh.N;
    if (!o->sh.H_kv) o->sh.H_kv = o->sh.H;
    o->sh.scale = softmax_scale > 0 ? softmax_scale : 1.0f / sqrtf((float)o->sh.d);
    o->softmax_scale_set = softmax_scale > 0;
    /* --hadamard chooses how FP8 quantizes: meaningless in any other dtype */
    if (o->hadamard >= 0 && o->dtype != DT_FP8)
        return bad(st, "--hadamard applies to --dtype fp8 only (this run is %s)", dtype_name(o->dtype));
    if (o->hadamard < 0) o->hadamard = o->dtype == DT_FP8;
    /* the outliers multiply the generated inputs; loaded ones are what they are */
    if (o->outliers > 1.0f && o->load_dir) return bad(st, "--outliers multiplies generated inputs; it does not go with --load");
    if (stage_takes(st, GPU_STAGE)) { /* the environment is part of a GPU stage's command line */
        char why[160];
        size_t cap;
        if (smem_cap_bytes(&cap, why, sizeof why)) return bad(st, "%s", why);
    }
    return 0;
}

#define SMEM_CAP_MAX_KB (1 << 20) /* far above any GPU's shared memory: a cap beyond it means nothing */

int smem_cap_bytes(size_t *cap, char *why, size_t n)
{
    const char *s = getenv("ATTN_SMEM_CAP_KB");
    *cap = 0;
    if (!s || !*s) return 0; /* unset or empty: the device's own limit */
    int kb;
    if (parse_int(s, 1, SMEM_CAP_MAX_KB, &kb)) {
        snprintf(why, n, "ATTN_SMEM_CAP_KB=%s: expected a whole number of KiB from 1 to %d (99: an RTX card, 64: a T4)",
                 s, SMEM_CAP_MAX_KB);
        return EXIT_USAGE;
    }
    *cap = (size_t)kb * 1024;
    return 0;
}

/* ---- the limits of a problem ---- */

/* Physical memory of this machine, in bytes (0 when unknown). */
static double machine_bytes(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    return pages > 0 && page > 0 ? (double)pages * page : 0;
}

/* The largest finite value of a dtype. Inputs are always rounded through fp16 (inputs.c), so
 * that every stage sees the same numbers: fp32 and fp16 inputs are fp16 values. */
static double dtype_max(enum dtype dt) { return dt == DT_BF16 ? 3.3895313892515355e38 : 65504.0; }

/* The scores' largest possible magnitude is scale * d * a^2 (|q . k| <= d a^2 for entries of at
 * most a). fp32 carries 24 bits: once |S| reaches 2^22, one unit of roundoff in a score is more
 * than 1/4 in the exponent of the softmax, so P is wrong by a factor of e^(1/4) or more in any
 * implementation, and no check can tell a right answer from a wrong one. */
#define SCORE_LIMIT 4194304.0 /* 2^22 */

int check_limits(const struct stage *st, const struct shape *sh, enum dtype dt, double amplitude, double outliers)
{
    /* host memory: Q, K, V, O (fp32) and the reference's copy of O, plus dO and three gradients
     * for a backward; double arithmetic, so a huge shape cannot wrap around */
    const double elems = (double)sh->B * sh->H * sh->N * sh->d;
    const double kv_elems = (double)sh->B * shape_kv_heads(sh) * shape_kv_len(sh) * sh->d;
    /* Q, O and the reference's O; K and V (a backward: also dO, dQ, dK, dV) */
    double bytes = (elems * (st->measures_backward ? 7 : 3) + kv_elems * 2) * sizeof(float);
    if (st->device == ON_CPU && st->workspace_bytes) { /* a CPU stage's own scratch (stage 1's scores) */
        const struct attn_args a = {.sh = *sh, .dtype = dt};
        bytes += (double)st->workspace_bytes(&a);
    }
    const double have = machine_bytes();
    if (have > 0 && bytes > have)
        return bad(st, "B=%d H=%d N=%d d=%d (N_kv=%d, H_kv=%d) needs about %.3g GB of host memory; this machine has "
                   "%.3g GB", sh->B, sh->H, sh->N, sh->d, shape_kv_len(sh), shape_kv_heads(sh), bytes / 1e9, have / 1e9);
    /* the outlier channels of Q and K hold the largest values, amplitude * outliers */
    if (amplitude * outliers > dtype_max(dt))
        return bad(st, "inputs of magnitude %g%s do not fit %s (largest %g)%s", amplitude * outliers,
                   outliers > 1 ? " (--input-scale times --outliers)" : "", dt == DT_BF16 ? "bf16" : "fp16", dtype_max(dt),
                   dt == DT_BF16 ? "" : ", the dtype every stage's inputs are rounded through");
    /* q . k sums d products of at most a^2, of which the outlier channels' (min(4, d) of them) are
     * at most (a F)^2 */
    const int n_out = sh->d < OUTLIER_CHANNELS ? sh->d : OUTLIER_CHANNELS;
    const double smax = (double)sh->scale * amplitude * amplitude * ((sh->d - n_out) + n_out * outliers * outliers);
    if (smax >= SCORE_LIMIT) {
        char bound[64] = "scale * d * a^2";
        if (outliers > 1) snprintf(bound, sizeof bound, "scale * a^2 * (d - %d + %d F^2)", n_out, n_out);
        return bad(st, "scores could reach %s = %.3g; fp32 resolves a softmax only below 2^22 = %.3g (lower "
                       "--softmax-scale, --input-scale%s)", bound, smax, SCORE_LIMIT, outliers > 1 ? " or --outliers" : "");
    }
    return 0;
}
