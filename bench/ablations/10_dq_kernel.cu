/* 10_dq_kernel.cu: stage 10 with --deterministic's dQ from the separate dQ kernel at every head dim
 *
 * Taken out: the ordered splits. Where a K/V tile is 128 keys (d <= 128) the stage's
 *   --deterministic adds dQ in a fixed order inside the dK/dV kernel, five N^2 d products as on
 *   the atomic path. Here the dK/dV kernel skips dQ at every d and stage10_dq_kernel computes it,
 *   parallel over Q tiles, recomputing S and dP: seven products. At d = 256 the stage already
 *   takes the dQ kernel, so there the two run the same code.
 * What it measures: what the splits buy over the dQ kernel at d <= 128 (notes/10_backward.md,
 *   "Tried, and why it lost"). Without --deterministic this is the stage's atomic path: time it
 *   with the flag.
 * Run: make ablations && bench/ablations/10_dq_kernel --batch 1 --heads 16 --seqlen 16384 --dim 128 --deterministic
 */
#include "stages/10_backward.cu"
#include "common/ablation.h"

ABLATION(10_dq_kernel, stage10_desc, "stage10-dq-kernel",
         "stage 10, --deterministic's dQ by the separate dQ kernel (7 products) at every d, not the ordered splits",
         NULL, backward<true>, tiles_for<true>)
