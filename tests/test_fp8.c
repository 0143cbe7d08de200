/* test_fp8.c: the host's FP8 e4m3 conversions (half.c) and the random-sign Hadamard transform
 * and outlier inputs of the FP8 stage (fp8.c).
 *
 * fp8::e4m3_every_code   every pattern but the two NaNs decodes to a value that encodes back to
 *                        it, and the finite values rise with the code (0x00 .. 0x7e)
 * fp8::e4m3_rounding     ties to even (normal and subnormal), saturation to 448 (infinity too),
 *                        the smallest subnormal, NaN
 * fp8::hadamard          the transform keeps dot products and lengths (it is orthogonal), and
 *                        spreads one large channel over all d: 50 in one channel becomes 50/sqrt(d)
 *                        in every channel
 * fp8::outliers          add_outliers scales exactly its channels of Q and K, in every row
 * fp8::emulation_error   the FP8 stage emulated (fp8_forward_row): small but nonzero error without
 *                        outliers; with them, the Hadamard transform below half of per-tensor's
 * fp8::check_accepts_emulation  the check of an FP8 run passes the emulation's own output and fails
 *                        it perturbed (an element of O, an L, a NaN, the other Hadamard setting)
 * fp8::options           --dtype fp8, --hadamard, --outliers parsed, and their exit-2 cases
 */
#define _GNU_SOURCE /* open_memstream */
#include "common_test.h"
#include "common/fp8.h"
#include "common/half.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

Test(fp8, e4m3_every_code)
{
    float prev = -1.0f;
    for (int c = 0; c < 256; c++) {
        const float x = e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            cr_assert(isnan(x), "0x%02x decodes to %g, want NaN", c, x);
            continue;
        }
        cr_assert(f32_to_e4m3(x) == c, "0x%02x decodes to %g, which encodes to 0x%02x", c, x, f32_to_e4m3(x));
        if (c <= 0x7e) {
            cr_assert(c == 0 || x > prev, "0x%02x (%g) is not above 0x%02x (%g)", c, x, c - 1, prev);
            prev = x;
        }
    }
    cr_assert(e4m3_to_f32(0x7e) == 448.0f && e4m3_to_f32(0x01) == 1.0f / 512 && e4m3_to_f32(0x08) == 1.0f / 64,
              "the largest (448), the smallest subnormal (2^-9) and the smallest normal (2^-6)");
}

Test(fp8, e4m3_rounding)
{
    static const struct {
        float x;
        uint8_t want;
        const char *why;
    } cases[] = {
        {1.0f + 1.0f / 16, 0x38, "halfway between 1 and 1.125: to 1 (even mantissa 0)"},
        {1.0f + 3.0f / 16, 0x3a, "halfway between 1.125 and 1.25: to 1.25 (even mantissa 2)"},
        {1.0f + 1.0f / 16 + 1e-3f, 0x39, "just past halfway: up"},
        {0.5f / 512, 0x00, "half the smallest subnormal: to 0 (even)"},
        {1.5f / 512, 0x02, "halfway between 1 and 2 units of 2^-9: to 2 (even)"},
        {7.5f / 512, 0x08, "halfway between the largest subnormal and 2^-6: to 2^-6 (even)"},
        {464.0f, 0x7e, "halfway past 448 (to 480, which e4m3 lacks): saturates"},
        {1e30f, 0x7e, "far past 448: saturates"},
        {INFINITY, 0x7e, "infinity: saturates"},
        {-INFINITY, 0xfe, "minus infinity: saturates to -448"},
        {-3.0f, 0xc4, "-3 = -1.5 x 2^1"},
        {-0.0f, 0x80, "minus zero"},
        {NAN, 0x7f, "NaN"},
    };
    for (size_t k = 0; k < TEST_COUNT(cases); k++)
        cr_expect(f32_to_e4m3(cases[k].x) == cases[k].want, "%s: %g encodes to 0x%02x, want 0x%02x", cases[k].why,
                  cases[k].x, f32_to_e4m3(cases[k].x), cases[k].want);
}

Test(fp8, hadamard)
{
    for (int d = 64; d <= 256; d *= 2) {
        int8_t *s = malloc(d);
        float *q = malloc(2 * d * sizeof(float)), *k = q + d;
        hadamard_signs(s, d, 7);
        int minus = 0;
        for (int c = 0; c < d; c++) minus += s[c] < 0;
        cr_assert(minus > d / 4 && minus < 3 * d / 4, "d=%d: %d of the signs are -1", d, minus);
        fill_uniform(q, 2 * d, 11, 1.0f, DT_F32);
        double dot = 0, qq = 0;
        for (int c = 0; c < d; c++) dot += (double)q[c] * k[c], qq += (double)q[c] * q[c];
        hadamard_rows(q, 2, d, s);
        double dot_h = 0, qq_h = 0;
        for (int c = 0; c < d; c++) dot_h += (double)q[c] * k[c], qq_h += (double)q[c] * q[c];
        cr_expect(fabs(dot_h - dot) < 1e-5 * sqrt(qq * d), "d=%d: q.k %g becomes %g", d, dot, dot_h);
        cr_expect(fabs(qq_h - qq) < 1e-5 * qq, "d=%d: |q|^2 %g becomes %g", d, qq, qq_h);
        /* one outlier channel spread evenly over all d */
        for (int c = 0; c < d; c++) q[c] = c == 5 ? 50.0f : 0.0f;
        hadamard_rows(q, 1, d, s);
        for (int c = 0; c < d; c++)
            cr_assert(fabsf(fabsf(q[c]) - 50.0f / sqrtf((float)d)) < 1e-4f, "d=%d: channel %d is %g, want +-%g", d, c,
                      q[c], 50.0f / sqrtf((float)d));
        free(s), free(q);
    }
}

Test(fp8, outliers)
{
    const struct shape sh = test_shape(1, 2, 3, 64, 0);
    const size_t n = shape_elems(&sh);
    float *Q = malloc(4 * n * sizeof(float)), *K = Q + n, *Q0 = K + n, *K0 = Q0 + n;
    fill_uniform(Q, n, 1, 1.0f, DT_F16), fill_uniform(K, n, 2, 1.0f, DT_F16);
    for (size_t e = 0; e < n; e++) Q0[e] = Q[e], K0[e] = K[e];
    add_outliers(&sh, 50.0f, DT_F16, Q, K);
    for (size_t e = 0; e < n; e++) {
        int c = (int)(e % 64), is_outlier = 0;
        for (int k = 0; k < OUTLIER_CHANNELS; k++) is_outlier |= outlier_channel(k, 64) == c;
        const float wq = is_outlier ? round_to_dtype(Q0[e] * 50.0f, DT_F16) : Q0[e];
        const float wk = is_outlier ? round_to_dtype(K0[e] * 50.0f, DT_F16) : K0[e];
        cr_assert(Q[e] == wq && K[e] == wk, "element %zu (channel %d): Q %g, K %g, want %g, %g", e, c, Q[e], K[e], wq, wk);
    }
    free(Q);
}

/* ---- the FP8 emulation (fp8_forward_row) and the check of an FP8 run (compare_fp8_head) ---- */

/* RMSE of head (0, 0)'s O, the FP8 way with blocks of `block` rows (block >= N: one scale for the
 * head, which with B = H = 1 is per tensor) and the Hadamard transform or not, against the oracle. */
static double test_fp8_rmse(const struct shape *sh, const float *Q, const float *K, const float *V, int block,
                            int hadamard, enum dtype p_dtype)
{
    const int N = sh->N, d = sh->d;
    struct fp8_head hd;
    fp8_head_quantize(&hd, sh, Q, K, V, 0, 0, block, hadamard);
    if (p_dtype == DT_F16) { /* the fp16 stages' way: inputs as they are, P in fp16 */
        memcpy(hd.q, Q, (size_t)N * d * sizeof(float)), memcpy(hd.k, K, (size_t)N * d * sizeof(float));
        memcpy(hd.v, V, (size_t)N * d * sizeof(float));
        hd.sq[0] = hd.sk[0] = hd.sv[0] = 1.0f, hd.block = N, hd.p_dtype = DT_F16;
    }
    double se = 0, *o = test_doubles(d), *o_ref = test_doubles(d), lse, lse_ref;
    float *S = test_floats(N);
    for (int i = 0; i < N; i++) {
        fp8_forward_row(&hd, i, keys_seen(sh, i), sh->scale, S, o, &lse, NULL);
        oracle_forward_row(sh, Q, K, V, 0, 0, i, o_ref, &lse_ref);
        for (int c = 0; c < d; c++) se += (o[c] - o_ref[c]) * (o[c] - o_ref[c]);
    }
    fp8_head_free(&hd);
    free(o), free(o_ref), free(S);
    return sqrt(se / ((double)N * d));
}

/* Without outliers FP8 costs little, but something: its error is nonzero, well above fp16's (P in
 * fp16) and below 1e-2 (bench/data/runs/19_fp8.md: 7.3e-4 at d = 128, N = 1024). With 4 channels
 * x50, a scale per tensor (one head: per head) is ~0.25 off, and the Hadamard transform with
 * blocks of FP8_BLOCK_ROWS takes it below half of that (the lab record: 0.37 of it at d = 128). */
Test(fp8, emulation_error)
{
    const struct shape sh = test_shape(1, 1, 1024, 128, 0);
    const size_t n = shape_elems(&sh);
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n);
    make_inputs(&sh, 1, 1.0f, DT_F16, Q, K, V);
    const double fp16 = test_fp8_rmse(&sh, Q, K, V, FP8_BLOCK_ROWS, 0, DT_F16);
    const double plain = test_fp8_rmse(&sh, Q, K, V, FP8_BLOCK_ROWS, 1, DT_FP8);
    cr_assert(plain > 10 * fp16 && plain < 1e-2, "no outliers: FP8's RMSE %.3e, fp16's %.3e", plain, fp16);
    add_outliers(&sh, 50.0f, DT_F16, Q, K);
    const double per_tensor = test_fp8_rmse(&sh, Q, K, V, sh.N, 0, DT_FP8);
    const double hadamard = test_fp8_rmse(&sh, Q, K, V, FP8_BLOCK_ROWS, 1, DT_FP8);
    cr_assert(per_tensor > 0.1 && hadamard < 0.5 * per_tensor,
              "outliers x50: per tensor RMSE %.3e, per block + Hadamard %.3e (ratio %.3f, want < 0.5)", per_tensor,
              hadamard, hadamard / per_tensor);
    free(Q), free(K), free(V);
}

/* The FP8 stage's output as the emulation computes it: O rounded to fp16 (as the stage returns
 * it), L in fp32; `hadamard` as --hadamard. */
static void test_fp8_emulated(const struct shape *sh, int hadamard, const float *Q, const float *K, const float *V,
                              float *O, float *L)
{
    const int d = sh->d;
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++) {
            struct fp8_head hd;
            fp8_head_quantize(&hd, sh, Q, K, V, b, h, FP8_BLOCK_ROWS, hadamard);
#pragma omp parallel
            {
                double *o = malloc(sizeof(double) * d), lse;
                float *S = malloc(sizeof(float) * shape_kv_len(sh));
#pragma omp for
                for (int i = 0; i < sh->N; i++) {
                    fp8_forward_row(&hd, i, keys_seen(sh, i), sh->scale, S, o, &lse, NULL);
                    for (int c = 0; c < d; c++) O[idx4(sh, b, h, i, c)] = round_to_dtype((float)o[c], DT_F16);
                    L[idx3(sh, b, h, i)] = (float)lse;
                }
                free(o), free(S);
            }
            fp8_head_free(&hd);
        }
}

/* What check_forward is handed as the stage (it only asks whether it is stage 1). */
static const struct stage test_fp8_desc = {
    .name = "fp8_emulated", .idea = "the FP8 stage emulated on the host", .device = ON_GPU, .dims = {0}, .dtypes = DT_FP8,
};

struct test_fp8_check {
    struct shape sh;
    int hadamard;
    float outliers;
};

/* A small shape, checked whole (every row); one past harness.c's 2^28 multiply-adds, checked on
 * sampled heads and rows (80 * 256^2 * 64 = 336M). Each with and without the transform and
 * outliers. */
ParameterizedTestParameters(fp8, check_accepts_emulation)
{
    const struct shape shapes[] = {test_shape(2, 3, 200, 64, 1), test_shape(1, 2, 257, 128, 0), test_shape(4, 20, 256, 64, 1)};
    const size_t count = TEST_COUNT(shapes) * 4;
    struct test_fp8_check *p = cr_malloc(sizeof *p * count);
    size_t k = 0;
    for (size_t s = 0; s < TEST_COUNT(shapes); s++)
        for (int hadamard = 0; hadamard <= 1; hadamard++)
            for (int out = 0; out <= 1; out++) p[k++] = (struct test_fp8_check){shapes[s], hadamard, out ? 50.0f : 1.0f};
    return cr_make_param_array(struct test_fp8_check, p, count, test_free_params);
}

/* The emulation's own output passes the check; the same with one element of O (in the last row of
 * the last head, which the sampled check always visits) moved by 0.05 (far past FP8's error without
 * outliers), with one L moved by 0.5, or with one element of O NaN, fails, naming the element. With
 * outliers, the output of the other Hadamard setting (its error ~2.7x without the transform)
 * fails a check told the transform was on. */
ParameterizedTest(struct test_fp8_check *c, fp8, check_accepts_emulation)
{
    const struct shape *sh = &c->sh;
    const size_t n = shape_elems(sh), rows = shape_rows(sh), last = n - 1 - (size_t)sh->d / 2;
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), 1.0f, DT_F16, Q, K, V);
    if (c->outliers > 1) add_outliers(sh, c->outliers, DT_F16, Q, K);
    test_fp8_emulated(sh, c->hadamard, Q, K, V, O, L);
    char label[96], *log;
    size_t log_len;
    snprintf(label, sizeof label, "B=%d H=%d N=%d d=%d%s hadamard %d outliers x%g", sh->B, sh->H, sh->N, sh->d,
             sh->causal ? " causal" : "", c->hadamard, c->outliers);
    double max_err;
    for (int t = 0; t < 5; t++) {
        if ((t == 1 || t == 2) && c->outliers > 1) continue; /* within the outliers' allowance: nothing to assert */
        const float o_keep = O[last], l_keep = L[rows - 1];
        if (t == 1) O[last] += 0.05f;
        if (t == 2) L[rows - 1] += 0.5f;
        if (t == 3) O[last] = NAN;
        if (t == 4 && !(c->hadamard && c->outliers > 1)) break;
        if (t == 4) test_fp8_emulated(sh, 0, Q, K, V, O, L);
        FILE *f = open_memstream(&log, &log_len);
        const int pass = check_forward(&test_fp8_desc, sh, DT_FP8, c->hadamard, Q, K, V, O, L, &max_err, f);
        fclose(f);
        if (t == 0) cr_assert(pass, "%s: the emulation's own output failed the check:\n%s", label, log);
        if (t == 1 && c->outliers == 1)
            cr_assert(!pass && strstr(log, "O: FAIL"), "%s: O moved by 0.05 passed:\n%s", label, log);
        if (t == 2 && c->outliers == 1)
            cr_assert(!pass && strstr(log, "L: FAIL"), "%s: L moved by 0.5 passed:\n%s", label, log);
        if (t == 3) cr_assert(!pass && strstr(log, "got nan"), "%s: a NaN in O passed:\n%s", label, log);
        if (t == 4) cr_assert(!pass, "%s: the output quantized without the transform passed a check told it was on", label);
        free(log);
        O[last] = o_keep, L[rows - 1] = l_keep;
    }
    free(Q), free(K), free(V), free(O), free(L);
}

/* ---- the options of an FP8 run, parsed in-process on a descriptor that takes fp8 ---- */

static const struct stage test_fp8_cli_desc = {
    .name = "fp8_stage", .idea = "a stage that takes fp8", .device = ON_GPU, .dims = {0}, .dtypes = DT_F16 | DT_FP8,
};
static const struct stage test_fp8_only_desc = {
    .name = "fp8_only", .idea = "a stage that takes fp8 alone", .device = ON_GPU, .dims = {0}, .dtypes = DT_FP8,
};

static int test_parse(const struct stage *st, struct opts *o, const char *a0, const char *a1, const char *a2,
                      const char *a3)
{
    char *argv[6] = {"test", (char *)a0, (char *)a1, (char *)a2, (char *)a3, NULL};
    int argc = 1, done;
    while (argc < 5 && argv[argc]) argc++;
    return parse_opts(st, argc, argv, o, &done);
}

Test(fp8, options)
{
    struct opts o;
    cr_assert(test_parse(&test_fp8_cli_desc, &o, "--dtype", "fp8", NULL, NULL) == 0 && o.dtype == DT_FP8 &&
              o.hadamard == 1 && o.outliers == 1.0f, "--dtype fp8: the Hadamard transform on by default, no outliers");
    cr_assert(test_parse(&test_fp8_cli_desc, &o, "--dtype", "fp8", "--hadamard", "0") == 0 && o.hadamard == 0,
              "--dtype fp8 --hadamard 0");
    cr_assert(test_parse(&test_fp8_cli_desc, &o, "--outliers", "50", NULL, NULL) == 0 && o.outliers == 50.0f &&
              o.dtype == DT_F16 && o.hadamard == 0, "--outliers 50 in fp16: hadamard 0");
    cr_assert(test_parse(&test_fp8_only_desc, &o, NULL, NULL, NULL, NULL) == 0 && o.dtype == DT_FP8 && o.hadamard == 1,
              "a stage of fp8 alone defaults to fp8 (got %s), the transform on", dtype_name(o.dtype));
    static const char *const bad[][4] = {
        {"--dtype", "fp16", "--hadamard", "1"}, /* --hadamard is fp8's */
        {"--hadamard", "0", NULL, NULL},       /* the default dtype is fp16 */
        {"--dtype", "fp8", "--hadamard", "2"}, {"--dtype", "fp8", "--hadamard", "yes"},
        {"--outliers", "0.99", NULL, NULL},    {"--outliers", "nan", NULL, NULL},
        {"--outliers", "-50", NULL, NULL},     {"--outliers", "50", "--load", "/nonexistent"},
    };
    for (size_t k = 0; k < TEST_COUNT(bad); k++)
        cr_assert(test_parse(&test_fp8_cli_desc, &o, bad[k][0], bad[k][1], bad[k][2], bad[k][3]) == EXIT_USAGE,
                  "%s %s %s %s: want exit 2", bad[k][0], bad[k][1], bad[k][2] ? bad[k][2] : "", bad[k][3] ? bad[k][3] : "");
    /* a stage without fp8 does not take --hadamard at all (stage 3: built everywhere, a GPU or not) */
    cr_assert(test_parse(test_find_stage("stage3"), &o, "--hadamard", "1", NULL, NULL) == EXIT_USAGE,
              "stage3 --hadamard 1: want exit 2");
    /* what a stage supports names fp8 where it has it; a backward refuses it */
    char why[256];
    const struct shape sh = test_shape(1, 1, 64, 64, 0);
    cr_assert(!stage_supports(&test_fp8_only_desc, &sh, DT_F16, why, sizeof why) && strstr(why, "supports: fp8"),
              "fp16 on an fp8 stage: %s", why);
    const struct stage bwd = {.name = "fp8_bwd", .device = ON_GPU, .dims = {0}, .dtypes = DT_FP8, .measures_backward = 1};
    cr_assert(!stage_supports(&bwd, &sh, DT_FP8, why, sizeof why) && strstr(why, "forward only"), "fp8 backward: %s", why);
    /* the limits: the outlier channels hold input_scale * F */
    cr_assert(check_limits(&test_fp8_cli_desc, &sh, DT_FP8, 1.0, 50.0) == 0, "--outliers 50 fits");
    cr_assert(check_limits(&test_fp8_cli_desc, &sh, DT_FP8, 2000.0, 40.0) == EXIT_USAGE, "2000 x 40 does not fit fp16");
}
