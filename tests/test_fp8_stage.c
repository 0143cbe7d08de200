/* test_fp8_stage.c: the FP8 stages (a descriptor whose dtypes include DT_FP8: stage 19) over a
 * grid of shapes, through the harness's own FP8 check (check_forward: every row against the fp64
 * oracle, each allowed twice the error of the stage's arithmetic emulated on the host).
 *
 * fp8::grid       every (N, d, causal) below with B = 2, H = 3, the Hadamard transform on and off,
 *                 inputs plain and with 4 outlier channels x50 in Q and K (add_outliers);
 * fp8::shapes     one head of a long tail, N = 1, many heads (several work items per block),
 *                 a problem large enough that the check samples heads and rows, and d = 64 under
 *                 the mask past the short causal rule (the grid's causal d = 64 is all within it):
 *                 at N = 1500 the last tile's third warpgroup straddles N; at N = 1200 its second
 *                 lies wholly past N and its third wholly past the padding (N rounded to 128);
 * fp8::v_blocks   V's first 64 rows of every head x100 and x1000: the other blocks' P, carried
 *                 against the head's largest V scale, fall toward e4m3's subnormals (the check's
 *                 emulation rounds them so too).
 * A case skips with a one-line reason where there is no CUDA device or not the architecture the
 * stage is built for (sm_90a). ATTN_TEST_STAGES picks stages as for the other grids. */
#include "common_test.h"
#include "common/fp8.h"
#include <stdlib.h>
#include <string.h>

static const int fp8_grid_N[] = {1, 2, 17, 64, 100, 257, 1000}; /* tails of the 64-row blocks, 128-row tiles */
static const int fp8_grid_d[] = {64, 128, 256};
static const int fp8_hadamard[] = {1, 0};
static const float fp8_outliers[] = {1.0f, 50.0f};

struct fp8_case {
    struct test_case tc;
    int hadamard;
    float outliers;
    float v_block0; /* V's first FP8_BLOCK_ROWS rows of every head times this (1: as drawn) */
};

/* Runs the case's stage in fp8 on fp16 inputs (with outliers where asked) and asserts that the
 * harness's FP8 check passes. */
static void test_fp8_case(const struct fp8_case *c)
{
    const struct stage *st = all_stages[c->tc.stage];
    const struct shape *sh = &c->tc.sh;
    char label[240], why[256];
    test_label(&c->tc, label, sizeof label);
    snprintf(label + strlen(label), sizeof label - strlen(label), " hadamard %d outliers x%g V block 0 x%g",
             c->hadamard, (double)c->outliers, (double)c->v_block0);
    test_require_gpu_arch(st->arch_sm, st->name);
    test_require_fit(st, sh, DT_FP8, 0, 0);

    const size_t n = shape_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), 1.0f, dtype_io(DT_FP8), Q, K, V);
    if (c->outliers > 1.0f) add_outliers(sh, c->outliers, dtype_io(DT_FP8), Q, K);
    if (c->v_block0 > 1.0f) { /* then rounded to the inputs' dtype again */
        const size_t block = (size_t)(sh->N < FP8_BLOCK_ROWS ? sh->N : FP8_BLOCK_ROWS) * sh->d;
        for (size_t head = 0; head < (size_t)sh->B * sh->H; head++)
            for (size_t e = 0; e < block; e++) V[head * sh->N * sh->d + e] *= c->v_block0;
        fill_rounded(V, n, dtype_io(DT_FP8));
    }
    test_poison(O, n);
    test_poison(L, rows);
    int rc = run_forward_host(st, sh, DT_FP8, c->hadamard, Q, K, V, O, L, why, sizeof why);
    cr_assert(rc == 0, "%s: the stage failed on a shape it says it supports (code %d): %s", label, rc, why);
    double max_err = 0;
    const int ok = check_forward(st, sh, DT_FP8, c->hadamard, Q, K, V, O, L, &max_err, stderr);
    cr_assert(ok, "%s: the FP8 check failed (max_err %.3e; the FAIL line above names the worst element)", label,
              max_err);
    free(Q), free(K), free(V), free(O), free(L);
}

/* Appends the cases of every FP8 stage on shape sh, each Hadamard setting and outlier factor. */
static void fp8_add(struct fp8_case *p, size_t *count, int s, const struct shape *sh)
{
    char why[256];
    if (!stage_supports(all_stages[s], sh, DT_FP8, why, sizeof why)) return;
    for (size_t hj = 0; hj < TEST_COUNT(fp8_hadamard); hj++)
        for (size_t oj = 0; oj < TEST_COUNT(fp8_outliers); oj++)
            p[(*count)++] = (struct fp8_case){.tc = {.stage = s, .sh = *sh, .dtype = DT_FP8, .amplitude = 1},
                                              .hadamard = fp8_hadamard[hj],
                                              .outliers = fp8_outliers[oj],
                                              .v_block0 = 1.0f};
}

static int fp8_stage(int s)
{
    return (all_stages[s]->dtypes & DT_FP8) && test_stage_selected(all_stages[s]);
}

ParameterizedTestParameters(fp8, grid)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(fp8_grid_N) * TEST_COUNT(fp8_grid_d) * 2 * TEST_COUNT(fp8_hadamard) *
                 TEST_COUNT(fp8_outliers);
    struct fp8_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    for (int s = 0; s < n_all_stages; s++) {
        if (!fp8_stage(s)) continue;
        for (size_t dj = 0; dj < TEST_COUNT(fp8_grid_d); dj++)
            for (size_t nj = 0; nj < TEST_COUNT(fp8_grid_N); nj++)
                for (int causal = 0; causal < 2; causal++) {
                    const struct shape sh = test_shape(2, 3, fp8_grid_N[nj], fp8_grid_d[dj], causal);
                    fp8_add(p, &count, s, &sh);
                }
    }
    return cr_make_param_array(struct fp8_case, p, count, test_free_params);
}

ParameterizedTest(struct fp8_case *c, fp8, grid) { test_fp8_case(c); }

static const struct { int B, H, N, d, causal; } fp8_shapes[] = {
    {1, 1, 3001, 128, 1}, /* one head, a long tail */
    {1, 1, 1, 256, 0},    /* one query */
    {4, 150, 65, 128, 1}, /* many heads: several work items per block */
    {2, 8, 4100, 128, 0}, /* large enough that the check samples heads and rows */
    {1, 2, 1500, 64, 1},  /* d = 64 under the mask past the short causal rule's N: three warpgroups */
    {1, 2, 1200, 64, 1},  /* ... its last tile's second warpgroup past N, its third past the padding */
};

ParameterizedTestParameters(fp8, shapes)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(fp8_shapes) * TEST_COUNT(fp8_hadamard) * TEST_COUNT(fp8_outliers);
    struct fp8_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    for (int s = 0; s < n_all_stages; s++) {
        if (!fp8_stage(s)) continue;
        for (size_t j = 0; j < TEST_COUNT(fp8_shapes); j++) {
            const struct shape sh = test_shape(fp8_shapes[j].B, fp8_shapes[j].H, fp8_shapes[j].N, fp8_shapes[j].d,
                                               fp8_shapes[j].causal);
            fp8_add(p, &count, s, &sh);
        }
    }
    return cr_make_param_array(struct fp8_case, p, count, test_free_params);
}

ParameterizedTest(struct fp8_case *c, fp8, shapes) { test_fp8_case(c); }

static const float fp8_v_block0[] = {100.0f, 1000.0f};

ParameterizedTestParameters(fp8, v_blocks)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(fp8_grid_d) * 2 * TEST_COUNT(fp8_v_block0);
    struct fp8_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!fp8_stage(s)) continue;
        for (size_t dj = 0; dj < TEST_COUNT(fp8_grid_d); dj++)
            for (int causal = 0; causal < 2; causal++)
                for (size_t vj = 0; vj < TEST_COUNT(fp8_v_block0); vj++) {
                    const struct shape sh = test_shape(1, 2, 600, fp8_grid_d[dj], causal);
                    if (!stage_supports(all_stages[s], &sh, DT_FP8, why, sizeof why)) continue;
                    p[count++] = (struct fp8_case){.tc = {.stage = s, .sh = sh, .dtype = DT_FP8, .amplitude = 1},
                                                   .hadamard = 1,
                                                   .outliers = 1.0f,
                                                   .v_block0 = fp8_v_block0[vj]};
                }
    }
    return cr_make_param_array(struct fp8_case, p, count, test_free_params);
}

ParameterizedTest(struct fp8_case *c, fp8, v_blocks) { test_fp8_case(c); }
