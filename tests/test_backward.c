/* test_backward.c: the stages that measure a backward (stage 10), on the GPU.
 *
 * backward::vs_reference  dQ, dK, dV over a grid of N (tails, N = 1), d, causal, fp16 and bf16,
 *                         with and without --deterministic: check_backward's rule (common/check.c,
 *                         tol_grad) against stage 1's backward or, for the larger shapes, the fp64
 *                         oracle on three whole heads (first, last, one from the middle); B = 2,
 *                         H = 3, and also B = H = 1 and B·H = 192 (fp16).
 * backward::deterministic --deterministic against itself and the atomic path, every d, fp16 and
 *                         bf16, causal and not, one head of N = 1 and 1000, B = 2, H = 3 at
 *                         N = 1000 and B·H = 192 at N = 129: two runs give dQ, dK, dV with
 *                         identical bits; dK and dV are the atomic path's bit for bit; dQ agrees
 *                         with the atomic path's within tol_grad.
 * backward::deterministic_small_smem  the same comparisons where a block may have only the
 *                         shared memory of the stage's smallest tiles: ATTN_SMEM_CAP_KB set to the
 *                         least KiB at which its forward and its --deterministic backward both
 *                         find tiles (asked of the stage, test_smallest_cap_kb), so that the
 *                         smaller dK/dV and dQ tiles an H200 never picks run too: every d, fp16,
 *                         causal and not, B = 2, H = 3, N = 1000.
 * Cases skip with a one-line reason where there is no CUDA device, or where the device cannot run
 * them (test_require_fit: bf16 on Turing's code, tiles larger than its shared memory).
 */
#include "common_test.h"
#include <stdlib.h>
#include <string.h>

static const int test_bwd_grid_N[] = {1, 2, 17, 64, 100, 257, 1000};
static const int test_bwd_grid_d[] = {32, 64, 128, 256}; /* those a stage does not take are left out */
static const enum dtype test_bwd_dtypes[] = {DT_F16, DT_BF16};

/* One backward case: test_case plus --deterministic. */
struct test_bwd_case {
    struct test_case tc;
    int deterministic;
};

/* Q, K, V and dO for a shape, seeded like the harness's (dO from a fourth stream). */
static void test_bwd_inputs(const struct shape *sh, enum dtype dt, float **Q, float **K, float **V, float **dO)
{
    size_t n = shape_elems(sh);
    *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *dO = test_floats(n);
    make_inputs(sh, test_seed(sh), 1.0f, dt, *Q, *K, *V);
    fill_uniform(*dO, n, test_seed(sh) * 3 + 3, 1.0f, dt);
}

ParameterizedTestParameters(backward, vs_reference)
{
    size_t max = (size_t)n_all_stages * (TEST_COUNT(test_bwd_dtypes) * TEST_COUNT(test_bwd_grid_N) + 3) *
                 TEST_COUNT(test_bwd_grid_d) * 2 * 2;
    struct test_bwd_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    /* beside the grid (B = 2, H = 3): one head, and many heads of a short sequence */
    static const int one_head_N[] = {1, 129};
    for (int s = 0; s < n_all_stages; s++) {
        if (!all_stages[s]->measures_backward || !test_stage_selected(all_stages[s])) continue;
        for (size_t di = 0; di < TEST_COUNT(test_bwd_grid_d); di++)
            for (int causal = 0; causal <= 1; causal++)
                for (int det = 0; det <= 1; det++) {
                    struct shape shapes[3] = {test_shape(1, 1, one_head_N[0], test_bwd_grid_d[di], causal),
                                              test_shape(1, 1, one_head_N[1], test_bwd_grid_d[di], causal),
                                              test_shape(8, 24, 65, test_bwd_grid_d[di], causal)};
                    for (int k = 0; k < 3; k++) {
                        if (!stage_supports(all_stages[s], &shapes[k], DT_F16, why, sizeof why)) continue;
                        p[count++] = (struct test_bwd_case){
                            .tc = {.stage = s, .sh = shapes[k], .dtype = DT_F16, .amplitude = 1.0f}, .deterministic = det};
                    }
                }
        for (size_t t = 0; t < TEST_COUNT(test_bwd_dtypes); t++)
            for (size_t ni = 0; ni < TEST_COUNT(test_bwd_grid_N); ni++)
                for (size_t di = 0; di < TEST_COUNT(test_bwd_grid_d); di++)
                    for (int causal = 0; causal <= 1; causal++)
                        for (int det = 0; det <= 1; det++) {
                            struct shape sh = test_shape(2, 3, test_bwd_grid_N[ni], test_bwd_grid_d[di], causal);
                            if (!stage_supports(all_stages[s], &sh, test_bwd_dtypes[t], why, sizeof why)) continue;
                            p[count++] = (struct test_bwd_case){
                                .tc = {.stage = s, .sh = sh, .dtype = test_bwd_dtypes[t], .amplitude = 1.0f},
                                .deterministic = det};
                        }
    }
    return cr_make_param_array(struct test_bwd_case, p, count, test_free_params);
}

ParameterizedTest(struct test_bwd_case *c, backward, vs_reference)
{
    const struct stage *st = all_stages[c->tc.stage];
    const struct shape *sh = &c->tc.sh;
    char label[160], why[256];
    test_label(&c->tc, label, sizeof label);
    test_require_gpu();
    test_require_fit(st, sh, c->tc.dtype, c->deterministic, 1);
    size_t n = shape_elems(sh);
    float *Q, *K, *V, *dO, *g[3] = {test_floats(n), test_floats(n), test_floats(n)};
    test_bwd_inputs(sh, c->tc.dtype, &Q, &K, &V, &dO);
    int rc = gpu_backward_host(st, sh, c->tc.dtype, c->deterministic, Q, K, V, dO, g[0], g[1], g[2], why, sizeof why);
    cr_assert(rc == 0, "%s%s: the backward failed (code %d): %s", label, c->deterministic ? " deterministic" : "", rc, why);
    double err;
    cr_assert(check_backward(sh, c->tc.dtype, Q, K, V, dO, g[0], g[1], g[2], &err, stderr, NULL, 0),
              "%s%s: dQ, dK or dV fails the check (the FAIL lines above name the worst element)", label,
              c->deterministic ? " deterministic" : "");
    free(Q), free(K), free(V), free(dO);
    for (int t = 0; t < 3; t++) free(g[t]);
}

/* One --deterministic case: a stage and a shape in a dtype (amplitude 1). */
ParameterizedTestParameters(backward, deterministic)
{
    /* one head of N = 1 and of N = 1000, B = 2, H = 3 at N = 1000, B·H = 44 at N = 1000 (on 132
     * SMs three splits of 8 or 16 K/V tiles, so the snake turns), and B·H = 192 at N = 129 (one
     * split: every block takes all of a head's tiles) */
    static const int shapes[][3] = {{1, 1, 1}, {1, 1, 1000}, {2, 3, 1000}, {1, 44, 1000}, {8, 24, 129}};
    size_t max = (size_t)n_all_stages * TEST_COUNT(shapes) * TEST_COUNT(test_bwd_grid_d) * TEST_COUNT(test_bwd_dtypes) * 2;
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!all_stages[s]->measures_backward || !test_stage_selected(all_stages[s])) continue;
        for (size_t k = 0; k < TEST_COUNT(shapes); k++)
            for (size_t di = 0; di < TEST_COUNT(test_bwd_grid_d); di++)
                for (size_t t = 0; t < TEST_COUNT(test_bwd_dtypes); t++)
                    for (int causal = 0; causal <= 1; causal++) {
                        struct shape sh = test_shape(shapes[k][0], shapes[k][1], shapes[k][2], test_bwd_grid_d[di], causal);
                        if (!stage_supports(all_stages[s], &sh, test_bwd_dtypes[t], why, sizeof why)) continue;
                        p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_bwd_dtypes[t], .amplitude = 1.0f};
                    }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

/* Runs c's shape twice with --deterministic and once without, and compares as described above. */
static void test_deterministic_vs_atomic(const struct test_case *c)
{
    const struct stage *st = all_stages[c->stage];
    const struct shape *sh = &c->sh;
    char label[160], why[256];
    test_label(c, label, sizeof label);
    test_require_gpu();
    test_require_fit(st, sh, c->dtype, 1, 1);
    test_require_fit(st, sh, c->dtype, 0, 1);
    size_t n = shape_elems(sh);
    float *Q, *K, *V, *dO, *g[3][3]; /* g[run][dQ, dK, dV]: runs 0 and 1 --deterministic, 2 atomic */
    test_bwd_inputs(sh, c->dtype, &Q, &K, &V, &dO);
    for (int run = 0; run < 3; run++) {
        for (int t = 0; t < 3; t++) g[run][t] = test_floats(n);
        const int det = run < 2;
        int rc = gpu_backward_host(st, sh, c->dtype, det, Q, K, V, dO, g[run][0], g[run][1], g[run][2], why, sizeof why);
        cr_assert(rc == 0, "%s%s: the backward failed (code %d): %s", label, det ? " deterministic" : "", rc, why);
    }
    static const char *names[3] = {"dQ", "dK", "dV"};
    for (int t = 0; t < 3; t++)
        cr_assert(!memcmp(g[0][t], g[1][t], n * sizeof(float)),
                  "%s: two --deterministic runs gave different bits in %s", label, names[t]);
    /* dK and dV come from the same dK/dV kernel on both paths: --deterministic changes dQ alone */
    for (int t = 1; t < 3; t++)
        cr_assert(!memcmp(g[0][t], g[2][t], n * sizeof(float)),
                  "%s: %s differs between --deterministic and the atomic path (only dQ should)", label, names[t]);
    /* dQ: the same terms summed in another order (and S from Q K^T rather than K Q^T), so the two
     * agree within check_backward's rule, the atomic path's dQ standing in for the reference */
    const double qmax = max_abs(Q, n), kmax = max_abs(K, n), dov = max_abs(dO, n) * max_abs(V, n);
    double *want = test_widen(g[2][0], n);
    struct cmp cq = compare(g[0][0], want, n, tol_grad(sh, c->dtype, qmax, kmax, dov, max_abs(g[2][0], n)));
    TEST_ASSERT_CMP(label, "dQ (--deterministic) vs dQ (atomic)", cq, sh, 0);
    free(want), free(Q), free(K), free(V), free(dO);
    for (int run = 0; run < 3; run++)
        for (int t = 0; t < 3; t++) free(g[run][t]);
}

ParameterizedTest(struct test_case *c, backward, deterministic) { test_deterministic_vs_atomic(c); }

/* One case with a capped shared memory: a stage and a head dim, causal or not (fp16). */
ParameterizedTestParameters(backward, deterministic_small_smem)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(test_bwd_grid_d) * 2;
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!all_stages[s]->measures_backward || !test_stage_selected(all_stages[s])) continue;
        for (size_t di = 0; di < TEST_COUNT(test_bwd_grid_d); di++)
            for (int causal = 0; causal <= 1; causal++) {
                struct shape sh = test_shape(2, 3, 1000, test_bwd_grid_d[di], causal);
                if (!stage_supports(all_stages[s], &sh, DT_F16, why, sizeof why)) continue;
                p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = DT_F16, .amplitude = 1.0f};
            }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

/* The least shared memory per block, in KiB, at which stage st finds tiles for its forward and
 * its --deterministic backward of shape sh (both run in a backward case); 0 if none up to 256. */
static int test_smallest_cap_kb(const struct stage *st, const struct shape *sh)
{
    struct attn_args a = {.sh = *sh, .dtype = DT_F16, .deterministic = 1};
    struct tile_config c;
    for (int kb = 1; kb <= 256; kb++)
        if (!st->tiles(&a, 0, (size_t)kb * 1024, &c) && !st->tiles(&a, 1, (size_t)kb * 1024, &c)) return kb;
    return 0;
}

ParameterizedTest(struct test_case *c, backward, deterministic_small_smem)
{
    const struct stage *st = all_stages[c->stage];
    if (!st->tiles) cr_skip_test("%s: built without its GPU code", st->name);
    const int kb = test_smallest_cap_kb(st, &c->sh);
    cr_assert(kb > 0, "%s d=%d: no tiles fit in 256 KiB", st->name, c->sh.d);
    char cap[16];
    snprintf(cap, sizeof cap, "%d", kb);
    /* this test's process only: the cap is read once, at the first look at the device's limit */
    setenv("ATTN_SMEM_CAP_KB", cap, 1);
    cr_log_info("%s d=%d under ATTN_SMEM_CAP_KB=%d", st->name, c->sh.d, kb);
    test_deterministic_vs_atomic(c);
}
