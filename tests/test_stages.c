/* test_stages.c: every registered stage against the reference, over a grid of shapes.
 *
 * stages::vs_stage1   every stage in all_stages[] (CPU and GPU), every (N, d, causal) of the
 *                     grid below with B = 2, H = 3, in every dtype the stage supports. Stage 1
 *                     is the reference of the others, so its own cases answer to the fp64 oracle.
 * stages::x50         inputs scaled x50 (scores of thousands): stage 1 against the oracle,
 *                     and every stage from stage 3 on (the online softmax) against stage 1.
 * stages::one_head    B = H = 1, one long sequence with a tail, and N = 1: every stage.
 * stages::grids       a stage's run-time choices of grid, each over the grid of shapes (stage 13:
 *                     the plain grid, and persistent grids of 1 and 3 blocks, whose blocks run many
 *                     work items in a row, which one block per SM never does on the shapes above;
 *                     each with its default schedule and with STAGE13_OVERLAP=0; and the work
 *                     order by sections of 1 and 4 heads, STAGE13_SECTION).
 * A GPU case skips with a one-line reason where there is no CUDA device, where the stage is
 * built for another architecture than the device's (the Hopper stages, sm_90a), or where the
 * device cannot run that case: bf16 on Turing's code, or no tiles of the stage fit its shared
 * memory (ATTN_SMEM_CAP_KB lowers it). ATTN_TEST_STAGES=4-10 keeps the grids to those stages.
 */
#include "common_test.h"
#include <stdlib.h>
#include <string.h>

static const int test_grid_N[] = {1, 2, 17, 64, 100, 257, 1000}; /* 1, tails of every tile size, > one tile */
static const int test_grid_d[] = {16, 32, 64, 128, 256};
static const enum dtype test_dtypes[] = {DT_F32, DT_F16, DT_BF16};
#define TEST_GRID_B 2
#define TEST_GRID_H 3

/* Runs tc's stage and its reference on the same seeded inputs (exact in the stage's dtype, so
 * stage 1 in fp32 sees the very same numbers) and asserts O and L, one assert each. */
static void test_stage_vs_reference(const struct test_case *tc)
{
    const struct stage *st = all_stages[tc->stage];
    const struct shape *sh = &tc->sh;
    char label[200], why[256];
    test_label(tc, label, sizeof label);
    /* NAME=value, space-separated, in this case's own process */
    for (const char *e = tc->env; *e;) {
        char name[64], value[48];
        const char *eq = strchr(e, '='), *end = strchr(e, ' ');
        if (!end) end = e + strlen(e);
        cr_assert(eq && eq < end && eq - e < (long)sizeof name, "%s: the case's environment is not NAME=value", label);
        snprintf(name, sizeof name, "%.*s", (int)(eq - e), e);
        snprintf(value, sizeof value, "%.*s", (int)(end - eq - 1), eq + 1);
        cr_assert(setenv(name, value, 1) == 0, "%s: setenv failed", label);
        e = *end ? end + 1 : end;
    }
    if (st->device == ON_GPU) {
        test_require_gpu_arch(st->arch_sm, st->name);
        test_require_fit(st, sh, tc->dtype, 0, 0);
    }

    size_t n = shape_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n);
    float *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), tc->amplitude, tc->dtype, Q, K, V);
    double qmax = max_abs(Q, n), kmax = max_abs(K, n), vmax = max_abs(V, n);
    double tolO = tol_output(sh, tc->dtype, qmax, kmax, vmax), tolL = tol_lse(sh, tc->dtype, qmax, kmax);

    double *Oref, *Lref;
    if (st == &stage1_desc) {
        /* stage 1 against the exact answer: its own fp32 allowance, nothing more */
        Oref = test_doubles(n), Lref = test_doubles(rows);
        oracle_forward(sh, Q, K, V, Oref, Lref);
    } else {
        /* Against stage 1, itself an fp32 computation: both sides carry rounding, so the allowance
         * is the stage's (check.c's rule for its dtype) plus stage 1's (the rule for fp32). For an
         * fp32 stage that is twice the fp32 tolerance. */
        float *O1 = test_floats(n), *L1 = test_floats(rows);
        int rc = run_forward_host(&stage1_desc, sh, DT_F32, Q, K, V, O1, L1, why, sizeof why);
        cr_assert(rc == 0, "%s: the reference stage 1 failed: %s", label, why);
        Oref = test_widen(O1, n), Lref = test_widen(L1, rows);
        free(O1), free(L1);
        tolO += tol_output(sh, DT_F32, qmax, kmax, vmax);
        tolL += tol_lse(sh, DT_F32, qmax, kmax);
    }

    test_poison(O, n);
    test_poison(L, rows);
    int rc = run_forward_host(st, sh, tc->dtype, Q, K, V, O, L, why, sizeof why);
    cr_assert(rc == 0, "%s: the stage failed on a shape it says it supports (code %d): %s", label, rc, why);
    struct cmp cO = compare(O, Oref, n, tolO), cL = compare(L, Lref, rows, tolL);
    TEST_ASSERT_CMP(label, "O", cO, sh, 0);
    TEST_ASSERT_CMP(label, "L", cL, sh, 1);
    free(Q), free(K), free(V), free(O), free(L), free(Oref), free(Lref);
}

/* ---- every stage over the grid ---- */

ParameterizedTestParameters(stages, vs_stage1)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(test_dtypes) * TEST_COUNT(test_grid_N) * TEST_COUNT(test_grid_d) * 2;
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!test_stage_selected(all_stages[s])) continue;
        for (size_t t = 0; t < TEST_COUNT(test_dtypes); t++)
            for (size_t dj = 0; dj < TEST_COUNT(test_grid_d); dj++)
                for (size_t nj = 0; nj < TEST_COUNT(test_grid_N); nj++)
                    for (int causal = 0; causal < 2; causal++) {
                        int N = test_grid_N[nj], d = test_grid_d[dj];
                        struct shape sh = test_shape(TEST_GRID_B, TEST_GRID_H, N, d, causal);
                        if (!stage_supports(all_stages[s], &sh, test_dtypes[t], why, sizeof why)) continue;
                        if (!test_stage_selected(all_stages[s])) continue;
                        p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_dtypes[t], .amplitude = 1};
                    }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, stages, vs_stage1) { test_stage_vs_reference(tc); }

/* ---- large-magnitude inputs ---- */

/* Inputs in [-50, 50] make scores of up to several thousand: exp overflows unless the row max is
 * subtracted first, and an online softmax's rescaling must stay finite as the max moves. Stage 2
 * sweeps the whole row for its max before any exp, the same as stage 1; the running max (and its
 * pitfalls) starts with stage 3, so every stage from 3 on is checked here, and stage 1 itself
 * against the oracle. */
#define TEST_X50 50.0f
static const struct { int N, d, causal; } test_x50_shapes[] = {
    {17, 16, 1}, {64, 64, 0}, {100, 64, 1}, {130, 32, 1}, {257, 128, 1}, {257, 128, 0}, {200, 256, 1},
};

ParameterizedTestParameters(stages, x50)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(test_dtypes) * TEST_COUNT(test_x50_shapes);
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        const struct stage *st = all_stages[s];
        if ((st != &stage1_desc && test_stage_number(st) < 3) || !test_stage_selected(st)) continue;
        for (size_t t = 0; t < TEST_COUNT(test_dtypes); t++)
            for (size_t j = 0; j < TEST_COUNT(test_x50_shapes); j++) {
                struct shape sh = test_shape(TEST_GRID_B, TEST_GRID_H, test_x50_shapes[j].N, test_x50_shapes[j].d,
                                             test_x50_shapes[j].causal);
                if (!stage_supports(st, &sh, test_dtypes[t], why, sizeof why)) continue;
                p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_dtypes[t], .amplitude = TEST_X50};
            }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, stages, x50) { test_stage_vs_reference(tc); }

/* ---- one head: B = H = 1 ----
 * A stage that splits work over (batch, head) and over the sequence must still cover a single
 * head's rows exactly once: a long sequence (many Q tiles, a tail in the last) and N = 1. */
static const struct { int N, d, causal; } test_one_head_shapes[] = {
    {1, 64, 0}, {1, 64, 1}, {3001, 64, 0}, {3001, 64, 1}, {2050, 128, 1},
};

ParameterizedTestParameters(stages, one_head)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(test_dtypes) * TEST_COUNT(test_one_head_shapes);
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!test_stage_selected(all_stages[s])) continue;
        for (size_t t = 0; t < TEST_COUNT(test_dtypes); t++)
            for (size_t j = 0; j < TEST_COUNT(test_one_head_shapes); j++) {
                struct shape sh = test_shape(1, 1, test_one_head_shapes[j].N, test_one_head_shapes[j].d,
                                             test_one_head_shapes[j].causal);
                if (!stage_supports(all_stages[s], &sh, test_dtypes[t], why, sizeof why)) continue;
                if (!test_stage_selected(all_stages[s])) continue;
                p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_dtypes[t], .amplitude = 1.0f};
            }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, stages, one_head) { test_stage_vs_reference(tc); }

/* ---- a stage's run-time grids ----
 * Stage 13 reads its grid and its schedule from the environment (stages/13_pingpong.cu,
 * run_choices): each grid over the grid's shapes in the 16-bit dtypes, with the default schedule
 * (the softmax under P V) and with the turned loop (STAGE13_OVERLAP=0; an env of several
 * NAME=value is space-separated). The persistent grid of 1 block runs every work item in one
 * block, so the ring's phases, the Q barriers and the turns carry over from item to item (up to 48
 * items here); 3 blocks take the snake order's odd rounds and a last partial round. The work
 * order's sections of heads (STAGE13_SECTION): the rule gives these small shapes one section of
 * all B * H = 6 heads, so sections of 1 and of 4 (a full one, then one of 2) are asked for. */
static const struct { const char *stage, *env; } test_grid_envs[] = {
    {"stage13", "STAGE13_PERSISTENT=0"},
    {"stage13", "STAGE13_BLOCKS=1"},
    {"stage13", "STAGE13_BLOCKS=3"},
    {"stage13", "STAGE13_OVERLAP=0 STAGE13_PERSISTENT=0"},
    {"stage13", "STAGE13_OVERLAP=0 STAGE13_BLOCKS=1"},
    {"stage13", "STAGE13_OVERLAP=0 STAGE13_BLOCKS=3"},
    {"stage13", "STAGE13_SECTION=1 STAGE13_BLOCKS=3"},
    {"stage13", "STAGE13_SECTION=4 STAGE13_BLOCKS=1"},
    {"stage13", "STAGE13_SECTION=4 STAGE13_PERSISTENT=0"},
};
static const enum dtype test_16bit[] = {DT_F16, DT_BF16};

ParameterizedTestParameters(stages, grids)
{
    size_t max = TEST_COUNT(test_grid_envs) * TEST_COUNT(test_16bit) * TEST_COUNT(test_grid_N) *
                 TEST_COUNT(test_grid_d) * 2;
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++)
        for (size_t e = 0; e < TEST_COUNT(test_grid_envs); e++) {
            if (strcmp(all_stages[s]->name, test_grid_envs[e].stage) || !test_stage_selected(all_stages[s])) continue;
            for (size_t t = 0; t < TEST_COUNT(test_16bit); t++)
                for (size_t dj = 0; dj < TEST_COUNT(test_grid_d); dj++)
                    for (size_t nj = 0; nj < TEST_COUNT(test_grid_N); nj++)
                        for (int causal = 0; causal < 2; causal++) {
                            int N = test_grid_N[nj], d = test_grid_d[dj];
                            struct shape sh = test_shape(TEST_GRID_B, TEST_GRID_H, N, d, causal);
                            if (!stage_supports(all_stages[s], &sh, test_16bit[t], why, sizeof why)) continue;
                            p[count] = (struct test_case){.stage = s, .sh = sh, .dtype = test_16bit[t], .amplitude = 1};
                            snprintf(p[count++].env, sizeof p->env, "%s", test_grid_envs[e].env);
                        }
        }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, stages, grids) { test_stage_vs_reference(tc); }
