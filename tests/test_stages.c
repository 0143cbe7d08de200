/* test_stages.c: every registered stage against the reference, over a grid of shapes.
 *
 * stages::vs_stage1   every stage in all_stages[] (CPU and GPU), every (N, d, causal) of the
 *                     grid below with B = 2, H = 3, in every dtype the stage supports. Stage 1
 *                     is the reference of the others, so its own cases answer to the fp64 oracle.
 * stages::x50         inputs scaled x50 (scores of thousands): stage 1 against the oracle,
 *                     and every stage from stage 3 on (the online softmax) against stage 1.
 * stages::one_head    B = H = 1, one long sequence with a tail, and N = 1: every stage.
 * stages::many_items  stage 14 (a persistent grid) on problems of hundreds of work items, so that
 *                     each block runs many in a row, and of several L2 sections of heads, against
 *                     stage 13 on the same inputs.
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
        int rc = run_forward_host(&stage1_desc, sh, DT_F32, 0, Q, K, V, O1, L1, why, sizeof why);
        cr_assert(rc == 0, "%s: the reference stage 1 failed: %s", label, why);
        Oref = test_widen(O1, n), Lref = test_widen(L1, rows);
        free(O1), free(L1);
        tolO += tol_output(sh, DT_F32, qmax, kmax, vmax);
        tolL += tol_lse(sh, DT_F32, qmax, kmax);
    }

    test_poison(O, n);
    test_poison(L, rows);
    int rc = run_forward_host(st, sh, tc->dtype, 0, Q, K, V, O, L, why, sizeof why);
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

static const enum dtype test_16bit[] = {DT_F16, DT_BF16};

/* ---- the persistent grid on problems of many work items ----
 * Stage 14 runs one block per SM, each looping over work items (Q tile, head) from a counter, in
 * sections of heads whose K and V fit half the L2. On the grid's shapes above a block gets one item
 * and every head is in one section, so these shapes give its blocks many items each (hundreds of
 * items for the SMs of any GPU that runs it), and, at d = 256 and N = 1000, several sections (a
 * head's K and V are 1 MB: 2 * 1000 * 256 * 2 bytes, against half of an H100's or H200's 50 MiB).
 * The CPU reference would take minutes at these sizes, so the answer is stage 13's on the same
 * inputs: the same attention, with the same tiles, on a grid of one block per item (stage 13 is
 * checked against stage 1 on the grid above). The tolerance is both stages' rule for the dtype. */
static const struct { int B, H, N; } test_many_items_shapes[] = {{4, 100, 17}, {2, 150, 300}, {1, 70, 1000}};

ParameterizedTestParameters(stages, many_items)
{
    size_t max = TEST_COUNT(test_many_items_shapes) * TEST_COUNT(test_16bit) * TEST_COUNT(test_grid_d) * 2;
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (strcmp(all_stages[s]->name, "stage14") || !test_stage_selected(all_stages[s])) continue;
        for (size_t k = 0; k < TEST_COUNT(test_many_items_shapes); k++)
            for (size_t t = 0; t < TEST_COUNT(test_16bit); t++)
                for (size_t dj = 0; dj < TEST_COUNT(test_grid_d); dj++)
                    for (int causal = 0; causal < 2; causal++) {
                        struct shape sh = test_shape(test_many_items_shapes[k].B, test_many_items_shapes[k].H,
                                                     test_many_items_shapes[k].N, test_grid_d[dj], causal);
                        if (!stage_supports(all_stages[s], &sh, test_16bit[t], why, sizeof why)) continue;
                        p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_16bit[t], .amplitude = 1};
                    }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, stages, many_items)
{
    const struct stage *st = all_stages[tc->stage], *ref = test_find_stage("stage13");
    const struct shape *sh = &tc->sh;
    char label[200], why[256];
    test_label(tc, label, sizeof label);
    test_require_gpu_arch(st->arch_sm, st->name);
    test_require_fit(st, sh, tc->dtype, 0, 0);
    test_require_fit(ref, sh, tc->dtype, 0, 0);

    size_t n = shape_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n);
    float *O = test_floats(n), *L = test_floats(rows), *O13 = test_floats(n), *L13 = test_floats(rows);
    make_inputs(sh, test_seed(sh), tc->amplitude, tc->dtype, Q, K, V);
    double qmax = max_abs(Q, n), kmax = max_abs(K, n), vmax = max_abs(V, n);
    double tolO = 2 * tol_output(sh, tc->dtype, qmax, kmax, vmax), tolL = 2 * tol_lse(sh, tc->dtype, qmax, kmax);
    int rc = run_forward_host(ref, sh, tc->dtype, 0, Q, K, V, O13, L13, why, sizeof why);
    cr_assert(rc == 0, "%s: the reference stage 13 failed (code %d): %s", label, rc, why);
    test_poison(O, n);
    test_poison(L, rows);
    rc = run_forward_host(st, sh, tc->dtype, 0, Q, K, V, O, L, why, sizeof why);
    cr_assert(rc == 0, "%s: the stage failed on a shape it says it supports (code %d): %s", label, rc, why);
    double *Oref = test_widen(O13, n), *Lref = test_widen(L13, rows);
    struct cmp cO = compare(O, Oref, n, tolO), cL = compare(L, Lref, rows, tolL);
    TEST_ASSERT_CMP(label, "O", cO, sh, 0);
    TEST_ASSERT_CMP(label, "L", cL, sh, 1);
    free(Q), free(K), free(V), free(O), free(L), free(O13), free(L13), free(Oref), free(Lref);
}
