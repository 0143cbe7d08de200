/* 14_one_section.cu: stage 14 with every head in one section: the work items heaviest first across
 * all B * H heads, head by head within a rank, so that the blocks running at once read as many
 * heads' K and V as there are blocks (the order without L2 sections). Timed beside stage 14 by
 * bench/ablate.sh. */
#include "stages/14_persistent.cu"
#include "common/ablation.h"

ABLATION(14_one_section, stage14_desc, "stage14-one-section", "stage 14, the work items in one section of every head",
         (forward<cfg, false>), NULL, (tiles_for<cfg, false>))
