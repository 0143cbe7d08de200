/* test_oracle.c: the references themselves.
 *
 * oracle::stage1_backward     stage 1's backward (dQ, dK, dV from its own forward's O and L)
 *                             against the fp64 oracle's backward, on small shapes.
 * oracle::finite_differences  the oracle's backward against central differences of the
 *                             oracle's forward: the one check that does not trust the formula.
 * oracle::backward_head       oracle_backward_head (blocked, for the harness's large shapes)
 *                             against oracle_backward head by head: the same sums, another order.
 * Stage 1's forward answers to the oracle in test_stages.c (stages::vs_stage1 and stages::x50:
 * for stage 1 the reference is the oracle), over the whole grid.
 */
#include "common_test.h"
#include <math.h>
#include <stdlib.h>

/* Largest |x| of a gradient given as several arrays of n doubles. */
static double test_max_abs3(double *const g[3], size_t n)
{
    double m = 0;
    for (int t = 0; t < 3; t++)
        for (size_t k = 0; k < n; k++)
            if (fabs(g[t][k]) > m) m = fabs(g[t][k]);
    return m;
}

/* ---- stage 1's backward against the oracle ---- */

/* Allowed error of stage 1's gradients: 1e-5 of the largest reference gradient element (dQ, dK,
 * dV taken together, so that an array that is exactly 0, as dQ and dK are at N = 1, is judged on
 * the gradient's scale). Stage 1 computes in fp32 with sums over N keys and d columns; measured
 * on these shapes its worst error is 7.6e-7 of that scale (dV, N = 257, d = 64; about 2e-6 at
 * N = 1000, not in this grid), growing about like sqrt(N) as fp32 sums do. 1e-5 leaves a 13x
 * margin and still fails anything wrong rather than rounded (a missed mask or scale is O(1), and
 * a 0.1% slip in one row of dV fails too). */
#define TEST_BWD_REL 1e-5

static const int test_bwd_N[] = {1, 2, 17, 64, 257};
static const int test_bwd_d[] = {16, 64};

ParameterizedTestParameters(oracle, stage1_backward)
{
    size_t max = TEST_COUNT(test_bwd_N) * TEST_COUNT(test_bwd_d) * 2, count = 0;
    struct test_case *p = cr_malloc(max * sizeof *p);
    int s1 = 0;
    while (all_stages[s1] != &stage1_desc) s1++; /* stage 1 is always registered: it is the reference */
    for (size_t dj = 0; dj < TEST_COUNT(test_bwd_d); dj++)
        for (size_t nj = 0; nj < TEST_COUNT(test_bwd_N); nj++)
            for (int causal = 0; causal < 2; causal++) {
                struct shape sh = test_shape(2, 3, test_bwd_N[nj], test_bwd_d[dj], causal);
                p[count++] = (struct test_case){.stage = s1, .sh = sh, .dtype = DT_F32, .amplitude = 1};
            }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, oracle, stage1_backward)
{
    const struct shape *sh = &tc->sh;
    char label[160], why[256];
    test_label(tc, label, sizeof label);
    size_t n = shape_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *dO = test_floats(n);
    float *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), tc->amplitude, DT_F32, Q, K, V);
    fill_uniform(dO, n, test_seed(sh) + 99, 1, DT_F32);

    int rc = run_forward_host(&stage1_desc, sh, DT_F32, 0, Q, K, V, O, L, why, sizeof why);
    cr_assert(rc == 0, "%s: stage 1's forward failed: %s", label, why);
    float *got[3] = {test_floats(n), test_floats(n), test_floats(n)};
    for (int t = 0; t < 3; t++) test_poison(got[t], n);
    struct attn_args a = {.sh = *sh, .dtype = DT_F32, .Q = Q, .K = K, .V = V, .O = O, .L = L,
                          .dO = dO, .dQ = got[0], .dK = got[1], .dV = got[2]};
    cr_assert(stage1_desc.backward(&a, why, sizeof why) == 0, "%s: stage 1's backward failed: %s", label, why);

    double *want[3] = {test_doubles(n), test_doubles(n), test_doubles(n)};
    oracle_backward(sh, Q, K, V, dO, want[0], want[1], want[2]);
    double tol = TEST_BWD_REL * test_max_abs3(want, n);
    struct cmp dQ = compare(got[0], want[0], n, tol), dK = compare(got[1], want[1], n, tol),
               dV = compare(got[2], want[2], n, tol);
    TEST_ASSERT_CMP(label, "dQ", dQ, sh, 0);
    TEST_ASSERT_CMP(label, "dK", dK, sh, 0);
    TEST_ASSERT_CMP(label, "dV", dV, sh, 0);
    for (int t = 0; t < 3; t++) free(got[t]), free(want[t]);
    free(Q), free(K), free(V), free(dO), free(O), free(L);
}

/* ---- the oracle's backward against finite differences of its forward ---- */

/* loss = sum(dO * O), O from the fp64 oracle: the loss whose gradient oracle_backward returns. */
static double test_loss(const struct shape *sh, const float *Q, const float *K, const float *V, const float *dO)
{
    size_t n = shape_elems(sh);
    double *O = test_doubles(n), *L = test_doubles(shape_rows(sh)), loss = 0;
    oracle_forward(sh, Q, K, V, O, L);
    for (size_t k = 0; k < n; k++) loss += (double)dO[k] * O[k];
    free(O), free(L);
    return loss;
}

/* Step h = 2^-8: x +- h of an input (fp16-exact, |x| <= 1) is exact in float, and the
 * denominator is taken as the float difference (x + h) - (x - h) all the same, so the only
 * errors are the central difference's truncation, h^2/6 |f'''|, and the fp64 rounding of the
 * loss over 2h (about 1e-16 |loss| / h = 1e-13, negligible). On inputs in [-1, 1] at d = 4 the
 * third derivatives are O(1): the measured error is at most 0.013 h^2 (1.9e-7) on these shapes
 * and falls 16x when h halves twice, as truncation does. The tolerance h^2 (1.5e-5 against
 * gradients of about 1) leaves an 80x margin and still fails a gradient off by a part in 1e4
 * (a 1e-4 relative slip in dK is caught). The oracle's gradient is compared as float
 * (compare() takes fp32): rounding it costs < 1e-7, under 1% of tol. */
#define TEST_FD_H (1.0f / 256)
#define TEST_FD_TOL ((double)TEST_FD_H * TEST_FD_H)

ParameterizedTestParameters(oracle, finite_differences)
{
    size_t count = 0;
    struct shape *p = cr_malloc(6 * sizeof *p);
    for (int N = 3; N <= 5; N++)
        for (int causal = 0; causal < 2; causal++) p[count++] = test_shape(1, 1, N, 4, causal);
    return cr_make_param_array(struct shape, p, count, test_free_params);
}

ParameterizedTest(struct shape *sh, oracle, finite_differences)
{
    char label[160];
    snprintf(label, sizeof label, "oracle B=%d H=%d N=%d d=%d %s", sh->B, sh->H, sh->N, sh->d,
             sh->causal ? "causal" : "full");
    size_t n = shape_elems(sh);
    float *X[3] = {test_floats(n), test_floats(n), test_floats(n)}, *dO = test_floats(n);
    make_inputs(sh, test_seed(sh), 1, DT_F32, X[0], X[1], X[2]);
    fill_uniform(dO, n, test_seed(sh) + 99, 1, DT_F32);

    double *grad[3] = {test_doubles(n), test_doubles(n), test_doubles(n)};
    oracle_backward(sh, X[0], X[1], X[2], dO, grad[0], grad[1], grad[2]);

    static const char *names[3] = {"dQ", "dK", "dV"};
    for (int t = 0; t < 3; t++) {
        float *got = test_floats(n);
        double *fd = test_doubles(n);
        for (size_t k = 0; k < n; k++) {
            float x = X[t][k], xp = x + TEST_FD_H, xm = x - TEST_FD_H;
            X[t][k] = xp;
            double fp = test_loss(sh, X[0], X[1], X[2], dO);
            X[t][k] = xm;
            double fm = test_loss(sh, X[0], X[1], X[2], dO);
            X[t][k] = x;
            fd[k] = (fp - fm) / ((double)xp - (double)xm);
            got[k] = (float)grad[t][k];
        }
        struct cmp c = compare(got, fd, n, TEST_FD_TOL);
        TEST_ASSERT_CMP(label, names[t], c, sh, 0);
        free(got), free(fd);
    }
    for (int t = 0; t < 3; t++) free(X[t]), free(grad[t]);
    free(dO);
}

/* ---- the blocked backward of one head against the plain one ---- */

/* oracle_backward_head adds the same terms as oracle_backward in another order (blocks of 32
 * queries and keys, the forward by the online softmax), so in fp64 they agree to rounding: 1e-12
 * of the largest gradient element allows for sums over 1000 keys of terms up to that size, each
 * rounding at 1.1e-16, with two orders of magnitude to spare; a wrong term (a block masked one key
 * off, a lost block) is far larger. Shapes across the block size: N = 1, 31, 32, 33, 100, 1000;
 * several heads, so that a head's offsets are exercised. */
ParameterizedTestParameters(oracle, backward_head)
{
    static const int shapes[][4] = {{1, 1, 1, 64}, {1, 2, 31, 32}, {2, 1, 32, 64}, {1, 3, 33, 128},
                                    {2, 2, 100, 64}, {1, 1, 1000, 32}};
    size_t count = 0;
    struct shape *p = cr_malloc(2 * TEST_COUNT(shapes) * sizeof *p);
    for (size_t k = 0; k < TEST_COUNT(shapes); k++)
        for (int causal = 0; causal < 2; causal++)
            p[count++] = test_shape(shapes[k][0], shapes[k][1], shapes[k][2], shapes[k][3], causal);
    return cr_make_param_array(struct shape, p, count, test_free_params);
}

ParameterizedTest(struct shape *sh, oracle, backward_head)
{
    char label[160];
    snprintf(label, sizeof label, "oracle_backward_head B=%d H=%d N=%d d=%d %s", sh->B, sh->H, sh->N, sh->d,
             sh->causal ? "causal" : "full");
    const size_t n = shape_elems(sh), nd = (size_t)sh->N * sh->d;
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *dO = test_floats(n);
    make_inputs(sh, test_seed(sh), 1, DT_F32, Q, K, V);
    fill_uniform(dO, n, test_seed(sh) + 99, 1, DT_F32);
    double *want[3] = {test_doubles(n), test_doubles(n), test_doubles(n)};
    oracle_backward(sh, Q, K, V, dO, want[0], want[1], want[2]);
    const double tol = 1e-12 * test_max_abs3(want, n);
    double *got[3] = {test_doubles(nd), test_doubles(nd), test_doubles(nd)};
    static const char *names[3] = {"dQ", "dK", "dV"};
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++) {
            oracle_backward_head(sh, Q, K, V, dO, b, h, got[0], got[1], got[2]);
            for (int t = 0; t < 3; t++)
                for (size_t k = 0; k < nd; k++) {
                    const double w = want[t][idx4(sh, b, h, 0, 0) + k];
                    cr_assert(fabs(got[t][k] - w) <= tol, "%s: %s of head (%d, %d), element %zu: %.17g, plain %.17g (tolerance %.3g)",
                              label, names[t], b, h, k, got[t][k], w, tol);
                }
        }
    for (int t = 0; t < 3; t++) free(got[t]), free(want[t]);
    free(Q), free(K), free(V), free(dO);
}
