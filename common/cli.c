/* cli.c: the one command line every stage takes. Bad input exits 2 with a one-line reason. */
#include "harness.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

static void usage(const struct stage *st, const struct opts *def, FILE *f)
{
    int gpu = st->device == ON_GPU;
    fprintf(f,
            "%s: %s\n"
            "usage: ./%s [options]\n"
            "  --batch B          batch size (default %d)\n"
            "  --heads H          heads (default %d)\n"
            "  --seqlen N         sequence length, any N >= 1 (default %d)\n"
            "  --dim d            head dim (default %d)\n"
            "  --causal           query i sees keys 0..i only\n"
            "  --dtype T          fp32, fp16 or bf16 (default %s)\n"
            "  --softmax-scale s  softmax scale (default 1/sqrt(d))\n"
            "  --input-scale a    inputs drawn uniformly from [-a, a] (default 1)\n"
            "  --seed S           input seed (default %llu)\n"
            "  --warmup W         untimed runs first (default %d)\n"
            "  --iters I          timed runs; median and minimum reported (default %d)\n"
            "  --no-check         skip the check against the reference\n"
            "  --csv              print a CSV header and row instead of the summary\n"
            "  --csv-row          print the CSV row alone\n"
            "%s"
            "%s"
            "%s"
            "  --load DIR         read q.npy k.npy v.npy ([B, H, N, d], float32 or float16) from DIR\n"
            "  --save DIR         write q.npy k.npy v.npy o.npy lse.npy (float32) into DIR\n"
            "  --help             this text\n"
            "example: ./%s --batch 2 --heads 8 --seqlen %d --dim 64 --causal\n",
            st->name, st->idea, st->name, def->sh.B, def->sh.H, def->sh.N, def->sh.d,
            dtype_name(def->dtype), (unsigned long long)def->seed, def->warmup, def->iters,
            gpu ? "  --flush-l2         overwrite the L2 cache before every timed run\n" : "",
            gpu && !st->measures_backward ? "  --counters         run the kernel's counting build once more and print the work on O\n"
                  "                     it counted, beside the HBM bytes its loop structure moves\n" : "",
            st->measures_backward ? "  --deterministic    bitwise-identical dQ from run to run (no atomics; slower)\n" : "",
            st->name, gpu ? 4096 : 1024);
}

static void defaults(const struct stage *st, struct opts *o)
{
    memset(o, 0, sizeof *o);
    int gpu = st->device == ON_GPU;
    /* CPU defaults finish in about a second on two cores even for stage 1; the GPU default
     * is big enough (4 x 16 heads of 4096) to fill the device */
    o->sh = (struct shape){.B = gpu ? 4 : 1, .H = gpu ? 16 : 4, .N = gpu ? 4096 : 1024, .d = 64, .causal = 0, .scale = 0};
    o->dtype = gpu ? DT_F16 : DT_F32;
    o->seed = 1234;
    o->input_scale = 1.0f;
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

/* A whole positive integer no larger than max. */
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
        /* flags without a value */
        if (!strcmp(name, "--help") || !strcmp(name, "-h")) { usage(st, &def, stdout); *done = 1; return EXIT_PASS; }
        if (!strcmp(name, "--causal")) { o->sh.causal = 1; continue; }
        if (!strcmp(name, "--no-check")) { o->check = 0; continue; }
        if (!strcmp(name, "--csv")) { o->csv = 1; continue; }
        if (!strcmp(name, "--csv-row")) { o->csv = o->csv_no_header = 1; continue; }
        if (!strcmp(name, "--flush-l2")) { o->flush_l2 = 1; continue; }
        if (!strcmp(name, "--counters")) { o->counters = 1; continue; }
        if (!strcmp(name, "--deterministic")) { o->deterministic = 1; continue; }
        /* options with a value */
        static const char *valued[] = {"--batch", "--heads", "--seqlen", "--dim", "--dtype", "--seed", "--warmup",
                                       "--iters", "--softmax-scale", "--input-scale", "--load", "--save"};
        int known = 0;
        for (size_t j = 0; j < sizeof valued / sizeof *valued; j++) known |= !strcmp(name, valued[j]);
        if (!known) return bad(st, "unknown option %s", name);
        if (!val) {
            if (k + 1 >= argc) return bad(st, "%s needs a value", name);
            val = argv[++k];
        }
        int err = 0;
        if (!strcmp(name, "--batch")) err = parse_int(val, 1, 1 << 16, &o->sh.B);
        else if (!strcmp(name, "--heads")) err = parse_int(val, 1, 1 << 16, &o->sh.H);
        else if (!strcmp(name, "--seqlen")) err = parse_int(val, 1, 1 << 20, &o->sh.N);
        else if (!strcmp(name, "--dim")) err = parse_int(val, 1, 1024, &o->sh.d);
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
            else return bad(st, "--dtype %s: expected fp32, fp16 or bf16", val);
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
    if (o->flush_l2 && st->device != ON_GPU) return bad(st, "--flush-l2 is for GPU stages");
    if (o->counters && st->device != ON_GPU) return bad(st, "--counters is for GPU stages");
    if (o->deterministic && !st->measures_backward) return bad(st, "--deterministic is for a stage that measures its backward");
    o->sh.scale = softmax_scale > 0 ? softmax_scale : 1.0f / sqrtf((float)o->sh.d);
    o->softmax_scale_set = softmax_scale > 0;
    return 0;
}
