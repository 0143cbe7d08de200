/* test_check.c: the harness's check can fail.
 *
 * A suite in which nothing can fail proves nothing. Here check_forward, the check every stage
 * binary runs, is handed deliberately wrong stages built in the test: stage 3 with the softmax
 * scale 1% off (a wrong constant: O moves by ~1e-3, far past the fp32 tolerance), and stage 3
 * with one output element left as NaN (an element a kernel forgot to write). Both must fail with
 * the worst element printed, while the real stage 3 passes, both on a small shape (whole output
 * against stage 1) and on one large enough for the sampled check against the oracle.
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
    cr_assert(run_forward_host(st, sh, DT_F32, Q, K, V, O, L, why, sizeof why) == 0, "%s: %s", st->name, why);
    FILE *log = open_memstream(log_text, &log_len);
    cr_assert(log != NULL, "open_memstream failed");
    double max_err;
    int pass = check_forward(st, sh, DT_F32, Q, K, V, O, L, &max_err, log);
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
