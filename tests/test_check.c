/* test_check.c: the harness's check can fail.
 *
 * A suite in which nothing can fail proves nothing. Here check_forward, the check every stage
 * binary runs, is handed deliberately wrong stages built in the test: stage 3 with the softmax
 * scale 1% off (a wrong constant: O moves by ~1e-3, far past the fp32 tolerance), and stage 3
 * with one output element left as NaN (an element a kernel forgot to write). Both must fail with
 * the worst element printed, while the real stage 3 passes, both on a small shape (whole output
 * against stage 1) and on one large enough for the sampled check against the oracle.
 * check_backward, stage 10's check of dQ, dK and dV, gets the same treatment (at the end).
 */
#define _GNU_SOURCE /* open_memstream */
#include "common_test.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int test_wrong_scale_forward(const struct attn_args *a, char *why, size_t n)
{
    struct attn_args wrong = *a;
    wrong.sh.scale *= 1.01f;
    return test_find_stage("stage3")->forward(&wrong, why, n);
}

/* The last element of O: in the last row of the last head, which the sampled check always visits. */
static int test_nan_forward(const struct attn_args *a, char *why, size_t n)
{
    int rc = test_find_stage("stage3")->forward(a, why, n);
    ((float *)a->O)[shape_elems(&a->sh) - 1] = NAN;
    return rc;
}

static const struct stage test_wrong_scale_desc = {
    .name = "wrong_scale", .idea = "stage 3 with scale * 1.01", .device = ON_CPU,
    .forward = test_wrong_scale_forward, .dims = {0}, .dtypes = DT_F32,
};
static const struct stage test_nan_desc = {
    .name = "one_nan", .idea = "stage 3 with O's last element NaN", .device = ON_CPU,
    .forward = test_nan_forward, .dims = {0}, .dtypes = DT_F32,
};

/* Runs st on sh and check_forward on its output; returns check_forward's verdict and what it
 * printed (to be freed). */
static int test_run_check(const struct stage *st, const struct shape *sh, char **log_text)
{
    size_t n = shape_elems(sh), rows = shape_rows(sh), log_len;
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), 1, DT_F32, Q, K, V);
    char why[256];
    cr_assert(run_forward_host(st, sh, DT_F32, 0, Q, K, V, O, L, why, sizeof why) == 0, "%s: %s", st->name, why);
    FILE *log = open_memstream(log_text, &log_len);
    cr_assert(log != NULL, "open_memstream failed");
    double max_err;
    int pass = check_forward(st, sh, DT_F32, 0, Q, K, V, O, L, &max_err, log);
    fclose(log);
    free(Q), free(K), free(V), free(O), free(L);
    return pass;
}

/* B*H*N^2*d: 2*3*100^2*32 = 1.9M multiply-adds, checked whole against stage 1; 1*1*4200^2*16 =
 * 282M, past harness.c's 2^28 limit, checked on sampled rows against the fp64 oracle. */
ParameterizedTestParameters(check, catches_wrong_stage)
{
    struct shape *p = cr_malloc(2 * sizeof *p);
    p[0] = test_shape(2, 3, 100, 32, 1);
    p[1] = test_shape(1, 1, 4200, 16, 0);
    return cr_make_param_array(struct shape, p, 2, test_free_params);
}

ParameterizedTest(struct shape *sh, check, catches_wrong_stage)
{
    char *log;
    int pass = test_run_check(test_find_stage("stage3"), sh, &log);
    cr_assert(pass, "the real stage 3 failed the check (N=%d d=%d):\n%s", sh->N, sh->d, log);
    cr_assert(log[0] == 0, "a passing check printed something:\n%s", log);
    free(log);

    pass = test_run_check(&test_wrong_scale_desc, sh, &log);
    cr_assert(!pass, "check_forward passed stage 3 with the softmax scale 1%% off (N=%d d=%d)", sh->N, sh->d);
    cr_assert(strstr(log, "O: FAIL worst at [b=") != NULL, "the failed check did not name O's worst element:\n%s", log);
    free(log);

    pass = test_run_check(&test_nan_desc, sh, &log);
    cr_assert(!pass, "check_forward passed an output holding a NaN (N=%d d=%d)", sh->N, sh->d);
    cr_assert(strstr(log, "got nan") != NULL && strstr(log, "nonfinite 1 of") != NULL,
              "the failed check did not show the NaN as the worst element:\n%s", log);
    free(log);
}

/* ---- the backward's check (check_backward, stage 10's) ----
 * The "stage" here is stage 1's fp32 backward on fp16 inputs with its gradients rounded to fp16,
 * what a correct fp16 kernel returns at best: it must pass. The same with dK 1% too large (a
 * wrong scale) must fail, as must dQ with one element NaN. The small shape is checked whole
 * against stage 1; the larger one (8 * 1024^2 * 64 = 537M multiply-adds) against the fp64 oracle
 * on its first and last head. */
static int test_run_check_backward(const struct shape *sh, int mutation, char **log_text)
{
    size_t n = shape_elems(sh), rows = shape_rows(sh), log_len;
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *dO = test_floats(n);
    float *O = test_floats(n), *L = test_floats(rows), *g[3] = {test_floats(n), test_floats(n), test_floats(n)};
    make_inputs(sh, test_seed(sh), 1, DT_F16, Q, K, V);
    fill_uniform(dO, n, test_seed(sh) * 3 + 3, 1.0f, DT_F16);
    struct attn_args a = {.sh = *sh, .dtype = DT_F32, .Q = Q, .K = K, .V = V, .O = O, .L = L,
                          .dO = dO, .dQ = g[0], .dK = g[1], .dV = g[2]};
    char why[256];
    cr_assert(stage1_desc.forward(&a, why, sizeof why) == 0 && stage1_desc.backward(&a, why, sizeof why) == 0,
              "stage 1: %s", why);
    for (int t = 0; t < 3; t++) fill_rounded(g[t], n, DT_F16);
    if (mutation == 1)
        for (size_t k = 0; k < n; k++) g[1][k] *= 1.01f;
    if (mutation == 2) g[0][n - 1] = NAN;
    FILE *log = open_memstream(log_text, &log_len);
    cr_assert(log != NULL, "open_memstream failed");
    double max_err;
    int pass = check_backward(sh, DT_F16, Q, K, V, dO, g[0], g[1], g[2], &max_err, log, NULL, 0);
    fclose(log);
    free(Q), free(K), free(V), free(dO), free(O), free(L);
    for (int t = 0; t < 3; t++) free(g[t]);
    return pass;
}

ParameterizedTestParameters(check, catches_wrong_gradient)
{
    struct shape *p = cr_malloc(2 * sizeof *p);
    p[0] = test_shape(2, 3, 100, 64, 1);
    p[1] = test_shape(1, 8, 1024, 64, 0);
    return cr_make_param_array(struct shape, p, 2, test_free_params);
}

ParameterizedTest(struct shape *sh, check, catches_wrong_gradient)
{
    char *log;
    cr_assert(test_run_check_backward(sh, 0, &log), "correctly rounded fp16 gradients failed (N=%d):\n%s", sh->N, log);
    free(log);
    cr_assert(!test_run_check_backward(sh, 1, &log), "check_backward passed dK 1%% too large (N=%d)", sh->N);
    cr_assert(strstr(log, "dK: FAIL worst at [b=") != NULL, "the failed check did not name dK's worst element:\n%s", log);
    free(log);
    cr_assert(!test_run_check_backward(sh, 2, &log), "check_backward passed a dQ holding a NaN (N=%d)", sh->N);
    cr_assert(strstr(log, "got nan") != NULL, "the failed check did not show the NaN:\n%s", log);
    free(log);
}
