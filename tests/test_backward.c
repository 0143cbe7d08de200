/* test_backward.c: the stages that measure a backward (stage 10), on the GPU.
 *
 * backward::vs_reference  dQ, dK, dV over a grid of N (tails, N = 1), d, causal, fp16 and bf16,
 *                         with and without --deterministic: check_backward's rule (common/check.c,
 *                         tol_grad) against stage 1's backward or, for the larger shapes, the fp64
 *                         oracle on three whole heads (first, last, one from the middle); B = 2,
 *                         H = 3, and also B = H = 1 and B·H = 192 (fp16).
 * backward::deterministic two runs with --deterministic give dQ, dK, dV with identical bits (every d).
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

Test(backward, deterministic)
{
    test_require_gpu();
    for (int s = 0; s < n_all_stages; s++) {
        const struct stage *st = all_stages[s];
        if (!st->measures_backward || !test_stage_selected(st)) continue;
        for (size_t di = 0; di < TEST_COUNT(test_bwd_grid_d); di++)
        for (int causal = 0; causal <= 1; causal++) {
            struct shape sh = test_shape(2, 3, 1000, test_bwd_grid_d[di], causal);
            char why0[256];
            if (!stage_supports(st, &sh, DT_F16, why0, sizeof why0)) continue;
            struct attn_args a = {.sh = sh, .dtype = DT_F16, .deterministic = 1};
            struct tile_config tc;
            if (st->tiles && st->tiles(&a, 1, gpu_smem_limit(), &tc)) continue; /* too large for this device */
            size_t n = shape_elems(&sh);
            float *Q, *K, *V, *dO, *g[2][3];
            test_bwd_inputs(&sh, DT_F16, &Q, &K, &V, &dO);
            char why[256];
            for (int run = 0; run < 2; run++) {
                for (int t = 0; t < 3; t++) g[run][t] = test_floats(n);
                int rc = gpu_backward_host(st, &sh, DT_F16, 1, Q, K, V, dO, g[run][0], g[run][1], g[run][2], why, sizeof why);
                cr_assert(rc == 0, "%s: the deterministic backward failed: %s", st->name, why);
            }
            static const char *names[3] = {"dQ", "dK", "dV"};
            for (int t = 0; t < 3; t++)
                cr_assert(!memcmp(g[0][t], g[1][t], n * sizeof(float)),
                          "%s d=%d causal=%d: two --deterministic runs gave different bits in %s", st->name, sh.d, causal,
                          names[t]);
            free(Q), free(K), free(V), free(dO);
            for (int run = 0; run < 2; run++)
                for (int t = 0; t < 3; t++) free(g[run][t]);
        }
    }
}
