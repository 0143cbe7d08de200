/* test_counters.c: the work the GPU stages' kernels count with --counters (their counting builds).
 *
 * counters::per_stage   each stage in the table below, over shapes with tails and causal masks:
 *                       the counting build still computes attention (checked as any run is); each
 *                       O row is corrected once per K/V tile it sees; it is normalized once per
 *                       tile in stage 4 and exactly once from stage 5 on.
 * counters::fa2_claims  N = 4096, d = 64, 64-key tiles: stage 4 normalizes each row 64 times and
 *                       stages 5-7 once, all four correct it 64 times; stages 4 and 5 read each Q
 *                       row 64 times, stages 6 and 7 once (from each stage's HBM formula).
 * Cases skip with a one-line reason where there is no CUDA device.
 */
#include "common_test.h"
#include <stdlib.h>

/* What each stage's loop structure does per O row: with Q tiles of Br rows and K/V tiles of Bc
 * keys, a row sees every K/V tile, or (causal) those up to the one holding its Q tile's last row;
 * it is normalized on each of them or once at the end. Br and Bc are the tiles the stage takes on
 * this device (its `tiles`: at d = 64 Br = 32, Bc = 64 in stages 4-6 and 128, 64 in 7 and 8 on
 * every GPU; at d = 128 smaller where shared memory is short). */
static const struct {
    const char *name;
    int normalize_every_tile;
} test_counted[] = {
    {"stage4", 1},
    {"stage5", 0},
    {"stage6", 0},
    {"stage7", 0},
    {"stage8", 0}, /* stage 7's loops, one Q tile per block: the same counts */
};

/* The tiles st takes for sh on this device. */
static struct tile_config test_tiles_of(const struct stage *st, const struct shape *sh)
{
    struct attn_args a = {.sh = *sh, .dtype = DT_F16};
    struct tile_config c;
    cr_assert(st->tiles != NULL, "%s names no tiles", st->name);
    cr_assert(st->tiles(&a, 0, gpu_smem_limit(), &c) == 0, "%s d=%d: %s", st->name, sh->d, c.text);
    return c;
}

/* The K/V tiles all rows of one head see, summed over the rows. */
static unsigned long long test_tiles_seen(const struct shape *sh, int Br, int Bc)
{
    const int Tc = CEIL_DIV(sh->N, Bc);
    unsigned long long n = 0;
    for (int q = 0; q < sh->N; q++) {
        const int last_row = (q / Br + 1) * Br - 1; /* of q's Q tile */
        n += sh->causal && last_row / Bc + 1 < Tc ? last_row / Bc + 1 : Tc;
    }
    return n;
}

/* Runs st's counting build on seeded inputs: the output must pass the stage's check, and the
 * counts come back in counts[]. */
static void test_counted_run(const struct stage *st, const struct shape *sh, unsigned long long *counts)
{
    char why[256];
    size_t n = shape_elems(sh), rows = shape_rows(sh);
    float *Q = test_floats(n), *K = test_floats(n), *V = test_floats(n), *O = test_floats(n), *L = test_floats(rows);
    make_inputs(sh, test_seed(sh), 1.0f, DT_F16, Q, K, V);
    test_poison(O, n);
    test_poison(L, rows);
    int rc = gpu_forward_host(st, sh, DT_F16, 0, Q, K, V, O, L, counts, why, sizeof why);
    cr_assert(rc == 0, "%s N=%d d=%d: the counting build failed (code %d): %s", st->name, sh->N, sh->d, rc, why);
    double err;
    cr_assert(check_forward(st, sh, DT_F16, 0, Q, K, V, O, L, &err, stderr),
              "%s N=%d d=%d causal=%d: the counting build's output fails the check (details above)", st->name,
              sh->N, sh->d, sh->causal);
    free(Q), free(K), free(V), free(O), free(L);
}

Test(counters, per_stage)
{
    test_require_gpu();
    const int Ns[] = {1, 63, 64, 100, 300};
    for (size_t s = 0; s < TEST_COUNT(test_counted); s++) {
        const struct stage *st = test_find_stage(test_counted[s].name);
        for (size_t k = 0; k < TEST_COUNT(Ns); k++)
            for (int d = 64; d <= 128; d += 64)
                for (int causal = 0; causal <= 1; causal++) {
                    struct shape sh = test_shape(2, 3, Ns[k], d, causal);
                    unsigned long long counts[N_COUNTERS];
                    test_counted_run(st, &sh, counts);
                    const struct tile_config tc = test_tiles_of(st, &sh);
                    const unsigned long long heads = 2 * 3, tiles = heads * test_tiles_seen(&sh, tc.Br, tc.Bc);
                    const unsigned long long norms = test_counted[s].normalize_every_tile ? tiles : heads * sh.N;
                    cr_expect(counts[CNT_ROW_CORRECT] == tiles,
                              "%s N=%d d=%d causal=%d: %llu row corrections counted, want %llu (one per row per K/V tile)",
                              st->name, sh.N, d, causal, counts[CNT_ROW_CORRECT], tiles);
                    cr_expect(counts[CNT_ROW_NORMALIZE] == norms,
                              "%s N=%d d=%d causal=%d: %llu row normalizations counted, want %llu (%s)", st->name,
                              sh.N, d, causal, counts[CNT_ROW_NORMALIZE], norms,
                              test_counted[s].normalize_every_tile ? "one per row per K/V tile" : "one per row");
                }
    }
}

Test(counters, fa2_claims)
{
    test_require_gpu();
    struct shape sh = test_shape(1, 2, 4096, 64, 0);
    const double rows = (double)shape_rows(&sh);
    double norm[TEST_COUNT(test_counted)], q_reads[TEST_COUNT(test_counted)];
    for (size_t s = 0; s < TEST_COUNT(test_counted); s++) {
        const struct stage *st = test_find_stage(test_counted[s].name);
        unsigned long long counts[N_COUNTERS];
        test_counted_run(st, &sh, counts);
        cr_assert(counts[CNT_ROW_CORRECT] == 64 * rows, "%s: %.2f corrections per row, want 64", st->name,
                  counts[CNT_ROW_CORRECT] / rows);
        norm[s] = counts[CNT_ROW_NORMALIZE] / rows;
        cr_assert(st->hbm_traffic, "%s has no HBM formula", st->name);
        struct hbm_traffic t;
        st->hbm_traffic(&sh, &t);
        q_reads[s] = t.q_reads;
    }
    cr_assert(norm[0] == 64 && norm[1] == 1 && norm[2] == 1 && norm[3] == 1,
              "normalizations per row: stage4 %.2f (want 64), stage5 %.2f, stage6 %.2f, stage7 %.2f (want 1)",
              norm[0], norm[1], norm[2], norm[3]);
    cr_assert(q_reads[0] == 64 && q_reads[1] == 64 && q_reads[2] == 1 && q_reads[3] == 1,
              "Q reads per row: stage4 %.2f, stage5 %.2f (want 64), stage6 %.2f, stage7 %.2f (want 1)", q_reads[0],
              q_reads[1], q_reads[2], q_reads[3]);
}
