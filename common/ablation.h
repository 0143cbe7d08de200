/* ablation.h: a stage's kernel with one piece taken out, to time what that piece buys.
 *
 * A file bench/ablations/NN_what.cu includes its stage's file (stages/NN_slug.cu), whose kernels
 * and launchers are then in the same translation unit, and instantiates them with other template
 * arguments (another configuration struct, a schedule flag). ABLATION() then names a descriptor,
 * the stage's own with that forward (or backward) and tiles instead: the harness runs and checks
 * it like any stage. The stage file itself builds one kernel per (head dim, dtype); the ablations
 * are built by `make ablations` and timed beside their stage by bench/ablate.sh. */
#ifndef ATTN_ABLATION_H
#define ATTN_ABLATION_H
#include "common/attn.h"

/* base with another name and idea, and with whichever of forward, backward and tiles is not NULL */
static inline struct stage ablation_of(const struct stage &base, const char *name, const char *idea, attn_fn forward,
                                       attn_fn backward,
                                       int (*tiles)(const struct attn_args *, int, size_t, struct tile_config *))
{
    struct stage s = base;
    s.name = name, s.idea = idea;
    if (forward) s.forward = forward;
    if (backward) s.backward = backward;
    if (tiles) s.tiles = tiles;
    return s;
}

/* The descriptor of bench/ablations/FILE.cu, which the Makefile's main for it names
 * (ablation_FILE_desc); NAME is its `stage` column in the CSV ("stage13-no-overlap"). */
#define ABLATION(FILE, BASE, NAME, IDEA, FORWARD, BACKWARD, TILES) \
    extern "C" const struct stage ablation_##FILE##_desc = ablation_of(BASE, NAME, IDEA, FORWARD, BACKWARD, TILES);

#endif
