/* test_decode.c: attention with a KV cache (--kv-len, --kv-heads), the shapes of generation.
 *
 * decode::oracle_semantics  the fp64 oracle's KV cache means what it says, checked against
 *                           self-attention: grouped heads are K and V repeated over each group of
 *                           H / H_kv heads (torch's repeat_interleave, or enable_gqa), and causal
 *                           queries are the last N rows of a square N_kv x N_kv causal problem.
 * decode::stage1_vs_oracle  stage 1 (the reference of stage 15) on KV-cache shapes, whole output,
 *                           against the oracle: grouped heads (multi-query too), N < N_kv, causal.
 * decode::vs_reference      every stage that takes a KV cache (stage 15) over the decode grid:
 *                           N_kv in {1, 17, 1000, 4097, 65536}, N in {1, 4, 64}, groups of 1, 4
 *                           and 8 query heads per KV head (B = 2, H_kv = 2), fp16 and bf16,
 *                           d = 64 and 128, causal and not (causal needs N_kv >= N).
 * decode::splits            --splits forced: one slice (the block writes O itself), a few, 64 and
 *                           65 (slices of one and two tiles, the merge's loads past a multiple of
 *                           its unroll), more slices than K/V tiles (empty slices, weighed at zero
 *                           by the merge), and the most, 1024 (1025 is refused: test_cli.c).
 * decode::odd_groups        multi-query (H_kv = 1, 32 heads: more rows than one block takes),
 *                           odd head counts, B = 1 and 5, inputs x50; and the benchmark's decode shape at B = 1
 *                           (32 heads over 8 KV heads, d = 128, one query) with 20000 keys.
 * The reference is stage 1 on the whole output where that is cheap (B H N N_kv d up to 2^27
 * multiply-adds), else the fp64 oracle on the rows of several heads (the first and last of each
 * KV group of the first and last batch) and, for every element, a finiteness check (outputs are
 * poisoned first: a row left unwritten is NaN).
 *
 * A GPU case skips with a one-line reason where there is no CUDA device or where the device cannot
 * run it: bf16 on Turing's code, or no tiles of the stage fit the shared memory a block may have
 * (ATTN_SMEM_CAP_KB lowers it), or --splits more than those tiles' merge takes (stage 15 with a
 * ring of two stages, 64 KiB: 512). ATTN_TEST_STAGES keeps the grids to the stages it lists, as in
 * test_stages.c.
 *
 * Every case checks the stage's second call on its workspace: the harness calls a stage that has
 * one once before the checked call, on all-zero queries (common/cuda/runner.cu, first_call). Stage
 * 14's merge counts the slices written in that workspace; a count the first call did not put back
 * to zero leaves rows unmerged (poisoned: NaN) or merged from the first call's partials (wrong).
 */
#include "common_test.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define TEST_WHOLE_MACS (1ull << 27)

/* ---- the reference ---- */


/* Runs tc's stage and checks O and L against stage 1 (whole) or the oracle (rows of a few heads),
 * one assert each. */
static void test_kv_vs_reference(const struct test_case *tc)
{
    const struct stage *st = all_stages[tc->stage];
    const struct shape *sh = &tc->sh;
    char label[192], why[256];
    test_label(tc, label, sizeof label);
    if (st->device == ON_GPU) {
        test_require_gpu_arch(st->arch_sm, st->name);
        test_require_fit(st, sh, tc->dtype, 0, 0);
    }
    cr_assert(stage_supports(st, sh, tc->dtype, why, sizeof why), "%s: %s", label, why);

    const size_t n = shape_elems(sh), nkv = shape_kv_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(nkv), *V = test_floats(nkv);
    float *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), tc->amplitude, tc->dtype, Q, K, V);
    const double qmax = max_abs(Q, n), kmax = max_abs(K, nkv), vmax = max_abs(V, nkv);
    double tolO = tol_output(sh, tc->dtype, qmax, kmax, vmax), tolL = tol_lse(sh, tc->dtype, qmax, kmax);

    test_poison(O, n);
    test_poison(L, rows);
    int rc = run_forward_host(st, sh, tc->dtype, 0, Q, K, V, O, L, why, sizeof why);
    cr_assert(rc == 0, "%s: the stage failed on a shape it says it supports (code %d): %s", label, rc, why);

    struct cmp cO, cL;
    const double macs = (double)sh->B * sh->H * sh->N * shape_kv_len(sh) * sh->d;
    if (macs <= (double)TEST_WHOLE_MACS) {
        /* the whole output against stage 1, both sides' rounding allowed (as test_stages.c) */
        float *O1 = test_floats(n), *L1 = test_floats(rows);
        rc = run_forward_host(&stage1_desc, sh, DT_F32, 0, Q, K, V, O1, L1, why, sizeof why);
        cr_assert(rc == 0, "%s: the reference stage 1 failed: %s", label, why);
        double *Oref = test_widen(O1, n), *Lref = test_widen(L1, rows);
        tolO += tol_output(sh, DT_F32, qmax, kmax, vmax);
        tolL += tol_lse(sh, DT_F32, qmax, kmax);
        cO = compare(O, Oref, n, tolO);
        cL = compare(L, Lref, rows, tolL);
        free(O1), free(L1), free(Oref), free(Lref);
    } else {
        /* the oracle, row by row: heads 0, G-1, G and H-1 (the ends of the first two KV groups and
         * the last head) of the first and the last batch; rows 0, 1, N/2, N-2, N-1 (all of them
         * where N <= 8) */
        const int G = sh->H / shape_kv_heads(sh);
        const int heads[4] = {0, G - 1, G < sh->H ? G : 0, sh->H - 1};
        const int batches[2] = {0, sh->B - 1};
        double *o = test_doubles(sh->d), lse;
        int first = 1;
        for (int bi = 0; bi < 2; bi++)
            for (int hi = 0; hi < 4; hi++)
                for (int r = 0; r < (sh->N <= 8 ? sh->N : 5); r++) {
                    const int i = sh->N <= 8 ? r : (int[]){0, 1, sh->N / 2, sh->N - 2, sh->N - 1}[r];
                    const int b = batches[bi], h = heads[hi];
                    oracle_forward_row(sh, Q, K, V, b, h, i, o, &lse);
                    const size_t row = idx3(sh, b, h, i);
                    struct cmp a = compare(O + row * sh->d, o, sh->d, tolO), l = compare(L + row, &lse, 1, tolL);
                    a.worst += row * sh->d, l.worst += row;
                    if (first) cO = a, cL = l, first = 0;
                    else cmp_merge(&cO, &a), cmp_merge(&cL, &l);
                }
        free(o);
        /* every element finite (poisoned before the run): no row left unwritten */
        if (!cO.nonfinite) cmp_fold_nonfinite(&cO, O, n);
        if (!cL.nonfinite) cmp_fold_nonfinite(&cL, L, rows);
    }
    TEST_ASSERT_CMP(label, "O", cO, sh, 0);
    TEST_ASSERT_CMP(label, "L", cL, sh, 1);
    free(Q), free(K), free(V), free(O), free(L);
}

/* The stages that take a KV cache, stage 1 (the reference) left out, where ATTN_TEST_STAGES takes them. */
static int test_kv_stage(int s)
{
    return all_stages[s]->kv_cache && all_stages[s] != &stage1_desc && test_stage_selected(all_stages[s]);
}

/* ---- the decode grid ---- */

static const int test_dec_Nkv[] = {1, 17, 1000, 4097, 65536};
static const int test_dec_N[] = {1, 4, 64};
static const int test_dec_G[] = {1, 4, 8};
static const int test_dec_d[] = {64, 128};
static const enum dtype test_dec_dtypes[] = {DT_F16, DT_BF16};
#define TEST_DEC_B 2
#define TEST_DEC_HKV 2

ParameterizedTestParameters(decode, vs_reference)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(test_dec_Nkv) * TEST_COUNT(test_dec_N) * TEST_COUNT(test_dec_G) *
                 TEST_COUNT(test_dec_d) * TEST_COUNT(test_dec_dtypes) * 2;
    struct test_case *p = cr_malloc(max * sizeof *p);
    size_t count = 0;
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!test_kv_stage(s)) continue;
        for (size_t a = 0; a < TEST_COUNT(test_dec_Nkv); a++)
            for (size_t q = 0; q < TEST_COUNT(test_dec_N); q++)
                for (size_t gi = 0; gi < TEST_COUNT(test_dec_G); gi++)
                    for (size_t dj = 0; dj < TEST_COUNT(test_dec_d); dj++)
                        for (size_t t = 0; t < TEST_COUNT(test_dec_dtypes); t++)
                            for (int causal = 0; causal < 2; causal++) {
                                if (causal && test_dec_Nkv[a] < test_dec_N[q]) continue; /* refused: decode::refusals */
                                struct shape sh = test_kv_shape(TEST_DEC_B, TEST_DEC_HKV * test_dec_G[gi], TEST_DEC_HKV,
                                                                test_dec_N[q], test_dec_Nkv[a], test_dec_d[dj], causal);
                                if (!stage_supports(all_stages[s], &sh, test_dec_dtypes[t], why, sizeof why)) continue;
                                p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_dec_dtypes[t],
                                                                .amplitude = 1};
                            }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, decode, vs_reference) { test_kv_vs_reference(tc); }

/* ---- --splits forced ---- */

static const struct { int H, H_kv, N, N_kv, d, causal, splits; } test_split_shapes[] = {
    {8, 2, 1, 4097, 128, 0, 1},   /* one slice: the split kernel writes O and L, no merge */
    {8, 2, 4, 1000, 64, 1, 1},
    {8, 2, 1, 4097, 128, 1, 7},   /* slices of unequal tile counts */
    {16, 2, 64, 1000, 128, 1, 3}, /* causal: the last slice holds keys some rows do not see */
    {8, 2, 1, 8192, 128, 0, 64},  /* 64 slices of two tiles */
    {8, 2, 4, 5000, 64, 1, 65},   /* 65 slices of one tile or none (Tc = 40): the merge's tail */
    {8, 2, 1, 5000, 128, 0, 65},  /* 65 slices of one or two tiles (Tc = 79) */
    {8, 2, 4, 100, 128, 1, 40},   /* more slices than K/V tiles: most are empty */
    {4, 4, 1, 1, 64, 0, 5},       /* one key, five slices */
    {8, 1, 17, 65536, 64, 1, 1024},
};

ParameterizedTestParameters(decode, splits)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(test_split_shapes) * TEST_COUNT(test_dec_dtypes), count = 0;
    struct test_case *p = cr_malloc(max * sizeof *p);
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!test_kv_stage(s) || !all_stages[s]->kv_splits) continue;
        for (size_t j = 0; j < TEST_COUNT(test_split_shapes); j++)
            for (size_t t = 0; t < TEST_COUNT(test_dec_dtypes); t++) {
                struct shape sh = test_kv_shape(2, test_split_shapes[j].H, test_split_shapes[j].H_kv, test_split_shapes[j].N,
                                                test_split_shapes[j].N_kv, test_split_shapes[j].d, test_split_shapes[j].causal);
                sh.splits = test_split_shapes[j].splits;
                if (!stage_supports(all_stages[s], &sh, test_dec_dtypes[t], why, sizeof why)) continue;
                p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_dec_dtypes[t], .amplitude = 1};
            }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, decode, splits) { test_kv_vs_reference(tc); }

/* ---- groups and batches off the grid, and large inputs ---- */

static const struct { int B, H, H_kv, N, N_kv, d, causal; float amplitude; } test_odd_shapes[] = {
    {1, 32, 1, 1, 5000, 128, 0, 1},   /* multi-query: 32 rows of one group, two blocks' worth */
    {1, 32, 1, 4, 3001, 64, 1, 1},    /* 128 rows: eight row tiles */
    {5, 6, 3, 3, 777, 128, 1, 1},     /* odd everything */
    {1, 1, 1, 1, 65536, 64, 0, 1},    /* one head: every block on one KV head */
    {3, 12, 4, 2, 2049, 64, 0, 50},   /* scores of thousands: the merge's max must keep exp finite */
    {2, 8, 2, 64, 300, 128, 1, 50},
    {1, 32, 8, 1, 20000, 128, 0, 1},  /* the benchmark's decode shape, B = 1: the splits rule's own S */
};

ParameterizedTestParameters(decode, odd_groups)
{
    size_t max = (size_t)n_all_stages * TEST_COUNT(test_odd_shapes) * TEST_COUNT(test_dec_dtypes), count = 0;
    struct test_case *p = cr_malloc(max * sizeof *p);
    char why[256];
    for (int s = 0; s < n_all_stages; s++) {
        if (!test_kv_stage(s)) continue;
        for (size_t j = 0; j < TEST_COUNT(test_odd_shapes); j++)
            for (size_t t = 0; t < TEST_COUNT(test_dec_dtypes); t++) {
                struct shape sh = test_kv_shape(test_odd_shapes[j].B, test_odd_shapes[j].H, test_odd_shapes[j].H_kv,
                                                test_odd_shapes[j].N, test_odd_shapes[j].N_kv, test_odd_shapes[j].d,
                                                test_odd_shapes[j].causal);
                if (!stage_supports(all_stages[s], &sh, test_dec_dtypes[t], why, sizeof why)) continue;
                p[count++] = (struct test_case){.stage = s, .sh = sh, .dtype = test_dec_dtypes[t],
                                                .amplitude = test_odd_shapes[j].amplitude};
            }
    }
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, decode, odd_groups) { test_kv_vs_reference(tc); }

/* ---- stage 1 against the oracle (the CPU: runs everywhere) ---- */

static const struct { int B, H, H_kv, N, N_kv, d, causal; } test_s1_shapes[] = {
    {2, 4, 1, 1, 1, 16, 0},    {2, 4, 1, 1, 17, 16, 1},   {1, 6, 2, 4, 300, 32, 1}, {1, 6, 2, 4, 300, 32, 0},
    {2, 8, 8, 17, 17, 16, 1},  {1, 8, 2, 17, 1000, 64, 1}, {3, 3, 3, 5, 64, 16, 1}, {1, 16, 4, 64, 65, 64, 1},
};

ParameterizedTestParameters(decode, stage1_vs_oracle)
{
    size_t count = 0;
    struct test_case *p = cr_malloc(TEST_COUNT(test_s1_shapes) * sizeof *p);
    int s1 = 0;
    while (all_stages[s1] != &stage1_desc) s1++;
    for (size_t j = 0; j < TEST_COUNT(test_s1_shapes); j++)
        p[count++] = (struct test_case){.stage = s1, .dtype = DT_F32, .amplitude = 1,
                                        .sh = test_kv_shape(test_s1_shapes[j].B, test_s1_shapes[j].H, test_s1_shapes[j].H_kv,
                                                            test_s1_shapes[j].N, test_s1_shapes[j].N_kv, test_s1_shapes[j].d,
                                                            test_s1_shapes[j].causal)};
    return cr_make_param_array(struct test_case, p, count, test_free_params);
}

ParameterizedTest(struct test_case *tc, decode, stage1_vs_oracle)
{
    const struct shape *sh = &tc->sh;
    char label[192], why[256];
    test_label(tc, label, sizeof label);
    const size_t n = shape_elems(sh), nkv = shape_kv_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(nkv), *V = test_floats(nkv), *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), 1, DT_F32, Q, K, V);
    test_poison(O, n);
    test_poison(L, rows);
    cr_assert(run_forward_host(&stage1_desc, sh, DT_F32, 0, Q, K, V, O, L, why, sizeof why) == 0, "%s: %s", label, why);
    double *Oref = test_doubles(n), *Lref = test_doubles(rows);
    oracle_forward(sh, Q, K, V, Oref, Lref);
    const double qmax = max_abs(Q, n), kmax = max_abs(K, nkv), vmax = max_abs(V, nkv);
    struct cmp cO = compare(O, Oref, n, tol_output(sh, DT_F32, qmax, kmax, vmax));
    struct cmp cL = compare(L, Lref, rows, tol_lse(sh, DT_F32, qmax, kmax));
    TEST_ASSERT_CMP(label, "O", cO, sh, 0);
    TEST_ASSERT_CMP(label, "L", cL, sh, 1);
    free(Q), free(K), free(V), free(O), free(L), free(Oref), free(Lref);
}

/* ---- what a KV cache means, against self-attention ---- */

/* Grouped heads: the oracle on [B, H_kv, N_kv, d] K and V equals the oracle on K and V with each
 * KV head repeated for the H / H_kv query heads of its group (head h reads KV head h / (H / H_kv)).
 * Causal: query i of N against N_kv keys equals row N_kv - N + i of the square causal problem whose
 * last N query rows are these (the first N_kv - N rows anything). Exact: the same fp64 sums. */
Test(decode, oracle_semantics)
{
    const int B = 2, H = 6, H_kv = 2, G = H / H_kv, N = 3, N_kv = 11, d = 8;
    for (int causal = 0; causal < 2; causal++) {
        struct shape kv = test_kv_shape(B, H, H_kv, N, N_kv, d, causal);
        struct shape sq = test_shape(B, H, N_kv, d, causal); /* square: N_kv queries, H KV heads */
        float *Q = test_floats(shape_elems(&kv)), *K = test_floats(shape_kv_elems(&kv)), *V = test_floats(shape_kv_elems(&kv));
        make_inputs(&kv, 99, 1, DT_F32, Q, K, V);
        float *Qs = test_floats(shape_elems(&sq)), *Ks = test_floats(shape_elems(&sq)), *Vs = test_floats(shape_elems(&sq));
        fill_uniform(Qs, shape_elems(&sq), 7, 1, DT_F32); /* the rows before the last N: anything */
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                memcpy(Qs + idx4(&sq, b, h, N_kv - N, 0), Q + idx4(&kv, b, h, 0, 0), sizeof(float) * N * d);
                memcpy(Ks + idx4(&sq, b, h, 0, 0), K + idx4_kv(&kv, b, h / G, 0, 0), sizeof(float) * N_kv * d);
                memcpy(Vs + idx4(&sq, b, h, 0, 0), V + idx4_kv(&kv, b, h / G, 0, 0), sizeof(float) * N_kv * d);
            }
        double o[8], os[8], lse, lses;
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < N; i++) {
                    oracle_forward_row(&kv, Q, K, V, b, h, i, o, &lse);
                    oracle_forward_row(&sq, Qs, Ks, Vs, b, h, N_kv - N + i, os, &lses);
                    cr_assert(lse == lses, "%s b=%d h=%d i=%d: lse %.17g, square problem's row %d %.17g",
                              causal ? "causal" : "full", b, h, i, lse, N_kv - N + i, lses);
                    for (int c = 0; c < d; c++)
                        cr_assert(o[c] == os[c], "%s b=%d h=%d i=%d c=%d: o %.17g, square problem's %.17g",
                                  causal ? "causal" : "full", b, h, i, c, o[c], os[c]);
                }
        free(Q), free(K), free(V), free(Qs), free(Ks), free(Vs);
    }
}

/* The shape's rules, without running anything: H a multiple of H_kv, causal needs N_kv >= N, a
 * stage without a KV cache refuses one, stage 15 at most 64 queries. (The command line's refusals
 * are in test_cli.c.) */
Test(decode, refusals)
{
    char why[256];
    struct shape sh = test_kv_shape(1, 6, 4, 1, 100, 64, 0);
    cr_assert(!stage_supports(&stage1_desc, &sh, DT_F32, why, sizeof why) && strstr(why, "--kv-heads"), "%s", why);
    sh = test_kv_shape(1, 4, 2, 8, 5, 64, 1);
    cr_assert(!stage_supports(&stage1_desc, &sh, DT_F32, why, sizeof why) && strstr(why, "at least"), "%s", why);
    sh.causal = 0; /* not causal, fewer keys than queries is attention all the same */
    cr_assert(stage_supports(&stage1_desc, &sh, DT_F32, why, sizeof why), "%s", why);
    for (int s = 0; s < n_all_stages; s++) {
        const struct stage *st = all_stages[s];
        struct shape kv = test_kv_shape(1, 4, 2, 8, 100, 64, 0);
        enum dtype dt = st->dtypes & DT_F16 ? DT_F16 : DT_F32;
        if (!st->kv_cache)
            cr_assert(!stage_supports(st, &kv, dt, why, sizeof why) && strstr(why, "self-attention only"),
                      "%s takes a KV cache it has no code for: %s", st->name, why);
        if (st->max_seqlen) {
            struct shape big = test_kv_shape(1, 4, 2, st->max_seqlen + 1, 1000, 64, 0);
            cr_assert(!stage_supports(st, &big, dt, why, sizeof why) && strstr(why, "at most"), "%s: %s", st->name, why);
        }
    }
}
