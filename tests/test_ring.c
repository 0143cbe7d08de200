/* test_ring.c: stage 20, ring attention. On one GPU, P ranks share it and pass their K/V blocks by
 * device-to-device copies (--transport copy), which runs the ring's schedule, the zigzag's pairs of
 * chunks and the merge exactly as over NCCL, the transfer aside; where the machine has a GPU per
 * rank, ring::nccl_vs_reference runs the transfers themselves.
 *
 * ring::vs_reference     P = 2, 4, 8 ranks, N in {1, 37, 1000, 1537} (2P chunks with tails, chunks
 *                        of padding only at N = 1 and 37, the ragged chunk of a full problem cut
 *                        into pieces), causal and not, d = 64 and 128, fp16: O and L against the
 *                        reference as the harness checks a stage (check_forward: stage 1 on the
 *                        whole output where cheap, else the fp64 oracle on sampled rows).
 * ring::bf16_and_heads   bf16, B = 2 and H = 3, P = 3 (an odd ring), causal and not.
 * ring::one_rank         P = 1: no transfer, the zigzag's two chunks of one rank.
 * ring::nccl_vs_reference  over NCCL, each rank a GPU of its own: P = 2, 4, 8 where the machine has
 *                        that many GPUs (skipped where not), N = 37 and 1537, d = 128, causal and
 *                        not: the transfers themselves, which the copy transport stands in for.
 * ring::nccl_needs_a_gpu_each  --transport nccl with more ranks than GPUs is refused (exit 2).
 * The command line (--gpus 0, a bad --transport, --gpus on a stage with no ranks): test_cli.c.
 * Every case skips with a one-line reason without a GPU, or where stage 20 is not built (no NCCL).
 */
#define _GNU_SOURCE /* open_memstream */
#include "common_test.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* stage 20, or the test skipped where this build has none (the Makefile builds it only where NCCL
 * is found) or ATTN_TEST_STAGES leaves it out */
static const struct stage *test_ring_stage(void)
{
    const struct stage *st = test_lookup_stage("stage20");
    if (!st) cr_skip_test("stage20 is not built here (NCCL not found)");
    if (!test_stage_selected(st)) cr_skip_test("stage20 is not among ATTN_TEST_STAGES");
    return st;
}

struct test_ring_case {
    int P;
    struct shape sh;
    enum dtype dtype;
};

/* Runs the ring of c->P ranks over `transport` (the copy transport: all on GPU 0) and checks O and L
 * as the harness does, the check's own lines in the assertion's message. Over NCCL with fewer GPUs
 * than ranks, the stage refuses (exit 2, pointing at the copy transport): the case is skipped. */
static void test_ring_vs_reference(const struct test_ring_case *c, int transport)
{
    const struct stage *st = test_ring_stage();
    test_require_gpu();
    test_require_fit(st, &c->sh, c->dtype, 0, 0);
    const struct shape *sh = &c->sh;
    char label[192], why[512];
    snprintf(label, sizeof label, "stage20 P=%d B=%d H=%d N=%d d=%d %s %s", c->P, sh->B, sh->H, sh->N, sh->d,
             sh->causal ? "causal" : "full", dtype_name(c->dtype));
    const size_t n = shape_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), 1.0f, c->dtype, Q, K, V);
    test_poison(O, n);
    test_poison(L, rows);
    int rc = gpu_forward_ranks_host(st, sh, c->dtype, c->P, transport, Q, K, V, O, L, why, sizeof why);
    if (transport == TRANSPORT_NCCL && rc == EXIT_USAGE && strstr(why, "--transport copy")) {
        free(Q), free(K), free(V), free(O), free(L);
        cr_skip_test("%d ranks over NCCL need %d GPUs: %s", c->P, c->P, why);
    }
    cr_assert(rc == 0, "%s: the ring failed (code %d): %s", label, rc, why);
    char *log = NULL;
    size_t log_n = 0;
    FILE *f = open_memstream(&log, &log_n);
    double max_err;
    const int pass = check_forward(st, sh, c->dtype, 0, Q, K, V, O, L, &max_err, f);
    fclose(f);
    cr_assert(pass, "%s: %s", label, log);
    free(log);
    free(Q), free(K), free(V), free(O), free(L);
}

static const int test_ring_P[] = {2, 4, 8};
static const int test_ring_N[] = {1, 37, 1000, 1537};
static const int test_ring_d[] = {64, 128};

ParameterizedTestParameters(ring, vs_reference)
{
    const size_t max = TEST_COUNT(test_ring_P) * TEST_COUNT(test_ring_N) * TEST_COUNT(test_ring_d) * 2;
    struct test_ring_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    for (size_t a = 0; a < TEST_COUNT(test_ring_P); a++)
        for (size_t b = 0; b < TEST_COUNT(test_ring_N); b++)
            for (size_t e = 0; e < TEST_COUNT(test_ring_d); e++)
                for (int causal = 0; causal < 2; causal++)
                    p[count++] = (struct test_ring_case){test_ring_P[a], test_shape(1, 2, test_ring_N[b], test_ring_d[e], causal),
                                                         DT_F16};
    return cr_make_param_array(struct test_ring_case, p, count, test_free_params);
}

ParameterizedTest(struct test_ring_case *c, ring, vs_reference, .timeout = 120)
{
    test_ring_vs_reference(c, TRANSPORT_COPY);
}

/* bf16 and several heads; then bf16 with padding and ragged chunks at d = 256 (stage 14's third
 * kernel), and d = 32 (stage 9's path, which the ring takes where stage 14 has no kernel) */
ParameterizedTestParameters(ring, bf16_and_heads)
{
    struct test_ring_case *p = cr_malloc(6 * sizeof *p);
    size_t count = 0;
    for (int causal = 0; causal < 2; causal++) {
        p[count++] = (struct test_ring_case){3, test_shape(2, 3, 300, 64, causal), DT_BF16};
        p[count++] = (struct test_ring_case){4, test_shape(1, 2, 37, 256, causal), DT_BF16};
        p[count++] = (struct test_ring_case){2, test_shape(1, 2, 37, 32, causal), DT_F16};
    }
    return cr_make_param_array(struct test_ring_case, p, count, test_free_params);
}

ParameterizedTest(struct test_ring_case *c, ring, bf16_and_heads, .timeout = 120)
{
    test_ring_vs_reference(c, TRANSPORT_COPY);
}

Test(ring, one_rank, .timeout = 120)
{
    for (int causal = 0; causal < 2; causal++) {
        const struct test_ring_case c = {1, test_shape(1, 2, 257, 128, causal), DT_F16};
        test_ring_vs_reference(&c, TRANSPORT_AUTO);
    }
}

ParameterizedTestParameters(ring, nccl_vs_reference)
{
    const int N[] = {37, 1537};
    const size_t max = TEST_COUNT(test_ring_P) * TEST_COUNT(N) * 2;
    struct test_ring_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    for (size_t a = 0; a < TEST_COUNT(test_ring_P); a++)
        for (size_t b = 0; b < TEST_COUNT(N); b++)
            for (int causal = 0; causal < 2; causal++)
                p[count++] = (struct test_ring_case){test_ring_P[a], test_shape(1, 2, N[b], 128, causal), DT_F16};
    return cr_make_param_array(struct test_ring_case, p, count, test_free_params);
}

ParameterizedTest(struct test_ring_case *c, ring, nccl_vs_reference, .timeout = 120)
{
    test_ring_vs_reference(c, TRANSPORT_NCCL);
}

Test(ring, nccl_needs_a_gpu_each)
{
    const struct stage *st = test_ring_stage();
    test_require_gpu();
    const struct shape sh = test_shape(1, 1, 64, 64, 0);
    const size_t n = shape_elems(&sh);
    float *Q = test_floats(n), *O = test_floats(n), *L = test_floats(shape_rows(&sh));
    make_inputs(&sh, 1, 1.0f, DT_F16, Q, Q, Q);
    char why[512] = "";
    /* 64 ranks, each a GPU of its own: no host has that many */
    const int rc = gpu_forward_ranks_host(st, &sh, DT_F16, 64, TRANSPORT_NCCL, Q, Q, Q, O, L, why, sizeof why);
    cr_assert(rc == EXIT_USAGE, "--gpus 64 --transport nccl: code %d, want %d (%s)", rc, EXIT_USAGE, why);
    cr_assert(strstr(why, "--transport copy") != NULL, "the reason should point at the copy transport: %s", why);
    free(Q), free(O), free(L);
}
