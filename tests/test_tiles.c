/* test_tiles.c: the tiles each GPU stage takes for the shared memory a device allows a block (its
 * descriptor's `tiles`, which calls the very code its launcher chooses with), on the CPU: these
 * need no GPU, only the GPU stages built (nvcc).
 *
 * tiles::h200_unchanged       at 227 KiB (H100, H200, B200) every stage takes the tiles it took
 *                             when it had one configuration per head dim: the H200 runs what it ran.
 * tiles::fit_every_device     at 163 KiB (A100), 99 KiB (RTX 30, 40, 50 cards) and 64 KiB (T4)
 *                             every forward has tiles for every head dim it takes, within the
 *                             limit; so does the backward but at d = 256 below 136.5 KiB, which it
 *                             refuses with one line saying what it needs. A Hopper-only stage
 *                             (arch_sm 90: stage 14 names its tiles too) runs at 227 KiB alone.
 * tiles::smaller_as_designed  stage 9 at d = 256: 99 KiB takes K/V tiles of 32 keys, 64 KiB of 16;
 *                             under its smallest tiles (16 KiB) a reason naming what those need.
 * tiles::deterministic_backward  stage 10's --deterministic dQ kernel: where it fits, and the
 *                             one-line refusal elsewhere.
 * tiles::split_kv_ring        stage 15 at 227, 163, 99 KiB: a ring of three K/V stages (96 KiB), at
 *                             64 KiB of two (64 KiB), the same K/V tiles; --splits up to what the
 *                             configuration's merge takes (1024, or 512 with two stages), more
 *                             refused in one line.
 */
#include "common_test.h"
#include <string.h>

#define KIB 1024

/* The GPU stages that name their tiles; skips the test when this build has none (no nvcc). */
static int test_tiled_stages(const struct stage **out, int max)
{
    int n = 0;
    for (int s = 0; s < n_all_stages && n < max; s++)
        if (all_stages[s]->device == ON_GPU && all_stages[s]->tiles) out[n++] = all_stages[s];
    if (!n) cr_skip_test("no GPU stage in this build (it needs nvcc)");
    return n;
}

/* st's tiles for d (fp16; deterministic for a backward) where a block may have `limit` bytes. */
static int test_tiles_det(const struct stage *st, int d, int backward, int deterministic, size_t limit,
                          struct tile_config *c)
{
    struct attn_args a = {.sh = test_shape(1, 1, 128, d, 0), .dtype = DT_F16, .deterministic = deterministic};
    memset(c, 0, sizeof *c);
    return st->tiles(&a, backward, limit, c);
}

/* The forward, or the backward without --deterministic. */
static int test_tiles(const struct stage *st, int d, int backward, size_t limit, struct tile_config *c)
{
    struct attn_args a = {.sh = test_shape(1, 1, 128, d, 0), .dtype = DT_F16, .deterministic = 0};
    memset(c, 0, sizeof *c);
    return st->tiles(&a, backward, limit, c);
}

Test(tiles, h200_unchanged)
{
    static const struct {
        const char *name;
        int backward, d, Br, Bc;
    } want[] = {
        {"stage4", 0, 64, 32, 64},    {"stage4", 0, 128, 32, 64},   {"stage5", 0, 64, 32, 64},
        {"stage5", 0, 128, 32, 64},   {"stage6", 0, 64, 32, 64},    {"stage6", 0, 128, 32, 64},
        {"stage7", 0, 64, 128, 64},   {"stage7", 0, 128, 128, 64},  {"stage8", 0, 64, 128, 64},
        {"stage8", 0, 128, 128, 64},  {"stage9", 0, 32, 128, 128},  {"stage9", 0, 64, 128, 128},
        {"stage9", 0, 128, 128, 64},  {"stage9", 0, 256, 64, 64},   {"stage10", 1, 32, 128, 128},
        {"stage10", 1, 64, 128, 128}, {"stage10", 1, 128, 64, 128}, {"stage10", 1, 256, 64, 64},
        {"stage15", 0, 64, 16, 128},  {"stage15", 0, 128, 16, 64},  {"stage16", 1, 64, 128, 128},
        {"stage16", 1, 128, 64, 128},
    };
    const struct stage *st[16];
    test_tiled_stages(st, 16);
    for (size_t k = 0; k < TEST_COUNT(want); k++) {
        const struct stage *s = test_find_stage(want[k].name);
        struct tile_config c;
        cr_assert(test_tiles(s, want[k].d, want[k].backward, 227 * KIB, &c) == 0, "%s d=%d at 227 KiB: %s",
                  s->name, want[k].d, c.text);
        cr_expect(c.Br == want[k].Br && c.Bc == want[k].Bc, "%s%s d=%d at 227 KiB takes Br=%d Bc=%d (%s), want Br=%d Bc=%d",
                  s->name, want[k].backward ? " backward" : "", want[k].d, c.Br, c.Bc, c.text, want[k].Br, want[k].Bc);
    }
}

Test(tiles, fit_every_device)
{
    static const int limits_kib[] = {163, 99, 64};
    const struct stage *st[16];
    const int n = test_tiled_stages(st, 16);
    for (int s = 0; s < n; s++)
        for (int backward = 0; backward <= (st[s]->measures_backward ? 1 : 0) && st[s]->arch_sm != 90; backward++)
            for (int k = 0; k < 8 && st[s]->dims[k]; k++)
                for (size_t j = 0; j < TEST_COUNT(limits_kib); j++) {
                    const int d = st[s]->dims[k];
                    const size_t limit = (size_t)limits_kib[j] * KIB;
                    struct tile_config c;
                    const int rc = test_tiles(st[s], d, backward, limit, &c);
                    if (backward && d == 256 && limit < 136 * KIB + 512) { /* the backward's one gap, by design */
                        cr_expect(rc == ATTN_UNSUPPORTED && strstr(c.text, "d=256 needs at least 136.5 KiB") &&
                                      !strchr(c.text, '\n'),
                                  "%s backward d=256 at %d KiB: want a one-line refusal naming 136.5 KiB, got rc %d: %s",
                                  st[s]->name, limits_kib[j], rc, c.text);
                        continue;
                    }
                    cr_expect(rc == 0, "%s%s d=%d at %d KiB: no tiles: %s", st[s]->name, backward ? " backward" : "",
                              d, limits_kib[j], c.text);
                    cr_expect(rc != 0 || (c.smem_bytes <= limit && c.Br > 0 && c.Bc > 0 && c.text[0]),
                              "%s%s d=%d at %d KiB: tiles '%s' of %zu bytes", st[s]->name, backward ? " backward" : "",
                              d, limits_kib[j], c.text, c.smem_bytes);
                }
}

Test(tiles, smaller_as_designed)
{
    const struct stage *st[16];
    test_tiled_stages(st, 16);
    const struct stage *s9 = test_find_stage("stage9");
    struct tile_config c;
    cr_assert(test_tiles(s9, 256, 0, 99 * KIB, &c) == 0 && c.Bc == 32 && c.smem_bytes <= 99 * KIB,
              "stage9 d=256 at 99 KiB: want K/V tiles of 32 keys, got '%s' (%zu bytes)", c.text, c.smem_bytes);
    cr_assert(test_tiles(s9, 256, 0, 64 * KIB, &c) == 0 && c.Bc == 16 && c.smem_bytes <= 64 * KIB,
              "stage9 d=256 at 64 KiB: want K/V tiles of 16 keys, got '%s' (%zu bytes)", c.text, c.smem_bytes);
    const int rc = test_tiles(s9, 256, 0, 16 * KIB, &c);
    cr_assert(rc == ATTN_UNSUPPORTED && strstr(c.text, "d=256 needs at least 64.0 KiB of shared memory per block"),
              "stage9 d=256 at 16 KiB: want the refusal naming its smallest tiles' 64 KiB, got rc %d: %s", rc, c.text);
}

/* --deterministic's dQ kernel (stage 10) has a list of tiles per head dim, as the dK/dV kernel
 * has: up to d = 128 it fits wherever the backward without it fits (its smallest dK/dV tiles:
 * 41, 40.5 and 52.5 KiB at d = 32, 64, 128), and at 64 KiB (a T4). At d = 256 its smallest
 * tiles take 161 KiB: an A100's 163 KiB runs it; 140 KiB (the dK/dV kernel's 136.5 fits) refuses
 * --deterministic alone in one line that says the atomic path fits, and 99 KiB refuses the
 * backward itself. */
Test(tiles, deterministic_backward)
{
    const struct stage *st[16];
    test_tiled_stages(st, 16);
    const struct stage *s10 = test_find_stage("stage10");
    static const struct { int d, kib, fits; } want[] = {
        {32, 41, 1},  {64, 41, 1},   {128, 53, 1},  {32, 64, 1},  {64, 64, 1},
        {128, 64, 1}, {64, 99, 1},   {128, 99, 1},  {256, 140, 0}, {256, 163, 1}, {256, 227, 1},
    };
    for (size_t k = 0; k < TEST_COUNT(want); k++) {
        struct tile_config c;
        const size_t limit = (size_t)want[k].kib * KIB;
        const int rc = test_tiles_det(s10, want[k].d, 1, 1, limit, &c);
        if (want[k].fits)
            cr_expect(rc == 0 && c.smem_bytes <= limit, "stage10 --deterministic d=%d at %d KiB: rc %d, tiles '%s' of "
                      "%zu bytes", want[k].d, want[k].kib, rc, c.text, c.smem_bytes);
        else
            cr_expect(rc == ATTN_UNSUPPORTED && strstr(c.text, "without it the backward fits") &&
                          !strchr(c.text, '\n'),
                      "stage10 --deterministic d=%d at %d KiB: want a one-line refusal, got rc %d: %s", want[k].d,
                      want[k].kib, rc, c.text);
    }
    struct tile_config c;
    const int rc = test_tiles_det(s10, 256, 1, 1, 99 * KIB, &c);
    cr_expect(rc == ATTN_UNSUPPORTED && strstr(c.text, "d=256 needs at least 136.5 KiB") && !strchr(c.text, '\n'),
              "stage10 --deterministic d=256 at 99 KiB: want the backward's own one-line refusal, got rc %d: %s", rc,
              c.text);
}

/* Stage 15 (split-KV decoding): the same K/V tiles everywhere (Bc = 128 at d = 64, 64 at d = 128,
 * 32 KiB of K and V a tile), three of them in the ring (96 KiB) where the device allows it, two (64
 * KiB) on a T4. The merge keeps a weight per slice and row over the ring: 1024 slices with three
 * stages, 512 with two; more is refused in one line, before anything runs. */
Test(tiles, split_kv_ring)
{
    const struct stage *st[16];
    test_tiled_stages(st, 16);
    const struct stage *s15 = test_find_stage("stage15");
    static const struct { int kib, stages, max_splits; } want[] = {{227, 3, 1024}, {163, 3, 1024}, {99, 3, 1024}, {64, 2, 512}};
    static const struct { int d, Bc; } dims[] = {{64, 128}, {128, 64}};
    for (size_t k = 0; k < TEST_COUNT(want); k++)
        for (size_t j = 0; j < TEST_COUNT(dims); j++) {
            const size_t limit = (size_t)want[k].kib * KIB;
            char words[32];
            snprintf(words, sizeof words, "%d K/V stages", want[k].stages);
            struct attn_args a = {.sh = test_kv_shape(1, 32, 8, 1, 16384, dims[j].d, 0), .dtype = DT_F16};
            struct tile_config c;
            cr_assert(s15->tiles(&a, 0, limit, &c) == 0, "stage15 d=%d at %d KiB: no tiles: %s", dims[j].d, want[k].kib,
                      c.text);
            cr_expect(c.Br == 16 && c.Bc == dims[j].Bc && strstr(c.text, words) &&
                          c.smem_bytes == (size_t)want[k].stages * 32 * KIB,
                      "stage15 d=%d at %d KiB takes '%s' (%zu bytes), want Br=16 Bc=%d, %s (%d KiB)", dims[j].d,
                      want[k].kib, c.text, c.smem_bytes, dims[j].Bc, words, want[k].stages * 32);
            a.sh.splits = want[k].max_splits;
            cr_expect(s15->tiles(&a, 0, limit, &c) == 0, "stage15 d=%d at %d KiB refuses --splits %d: %s", dims[j].d,
                      want[k].kib, a.sh.splits, c.text);
            if (want[k].max_splits == 1024) continue; /* the command line's own limit (test_cli.c) */
            a.sh.splits = want[k].max_splits + 1;
            const int rc = s15->tiles(&a, 0, limit, &c);
            cr_expect(rc == ATTN_UNSUPPORTED && strstr(c.text, "at most 512 slices") && !strchr(c.text, '\n'),
                      "stage15 d=%d at %d KiB --splits %d: want a one-line refusal naming 512, got rc %d: %s", dims[j].d,
                      want[k].kib, a.sh.splits, rc, c.text);
        }
}
