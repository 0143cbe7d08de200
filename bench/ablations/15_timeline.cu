/* 15_timeline.cu: stage 15 with the clock stamped at each of its marks, to see where a block's time goes.
 *
 * Not a piece taken out but instrumentation: stage 15's kernel built with timeline_probe for its
 * probe (common/cuda/timeline.cuh) instead of the stage's no_probe. Thread 0 of every block stamps
 * the GPU's nanosecond clock at the block's start, when its first K/V tile has landed, at the
 * loop's end, when its partials are written and fenced (with one slice: its O), and when it
 * leaves; the last block of a row tile also after its ticket, after the L_s are in shared memory
 * and after the weights, and leaves after the merge. At the program's end the last launch's stamps
 * are summarized on stderr and written, a row per block, to /tmp/stage15_timeline.csv (columns
 * block, x, y, sm, then a column per mark in µs after the first block's start; empty where a block
 * has no such mark). The stamps cost a few instructions per mark: compare the time by events with
 * ./stage15's in the same call.
 * Run: make bench/ablations/15_timeline && bench/ablations/15_timeline --batch 1 --heads 32 --kv-heads 8 \
 *      --seqlen 1 --kv-len 16384 --dim 128 --flush-l2 --no-check --warmup 5 --iters 30
 */
#include "stages/15_split_kv.cu"
#include "common/ablation.h"
#include "common/cuda/timeline.cuh"

namespace {

typedef timeline_probe<MARKS> stamped;

/* stage 15's marks (enum mark), in order */
const timeline_mark marks[MARKS] = {
    {"start_us", "start"},
    {"first_tile_us", "first K/V tile landed"},
    {"loop_end_us", "loop end"},
    {"partials_us", "partials written, fenced"},
    {"ticket_us", "merge: ticket drawn"},
    {"merge_l_us", "merge: L_s loaded"},
    {"merge_w_us", "merge: weights"},
    {"end_us", "end"},
};
const char *const CSV_PATH = "/tmp/stage15_timeline.csv";

/* The stage's launch with the stamped tiles, the grid named first for the report. */
template <typename T>
int dispatch_stamped(const struct attn_args *a, char *why, size_t n)
{
    return with_tiles<stamped>(a->sh.d, gpu_smem_limit(), why, n, [&](auto tl) {
        typedef decltype(tl) Tl;
        const struct shape *sh = &a->sh;
        const int S = splits_for<Tl>(sh, why, n);
        if (S > 0) /* (else launch says why) */
            timeline_watch("stage15", marks, MARKS, (unsigned)((long long)sh->B * shape_kv_heads(sh) * row_tiles_of(sh)),
                           (unsigned)S, CSV_PATH);
        return launch<T, Tl>(a, why, n);
    });
}

int forward_stamped(const struct attn_args *a, char *why, size_t n)
{
    if (a->dtype == DT_F16) return dispatch_stamped<__half>(a, why, n);
    if (a->dtype == DT_BF16) return dispatch_stamped<__nv_bfloat16>(a, why, n);
    snprintf(why, n, "supports fp16 and bf16 (got %s)", dtype_name(a->dtype));
    return ATTN_UNSUPPORTED;
}

} // namespace

ABLATION(15_timeline, stage15_desc, "stage15-timeline",
         "stage 15 with the clock stamped per block at each phase (instrumentation: the last launch's "
         "timeline on stderr and in /tmp/stage15_timeline.csv)",
         forward_stamped, NULL, NULL)
