/* 12_two_warpgroups.cu: stage 12's kernel with two consumer warpgroups at every head dim
 *
 * Taken out: the third consumer warpgroup at d = 64 and 128. Br = 128 instead of 192, 384 threads,
 *   the consumers 240 registers each after setmaxnreg instead of 160; at d = 128 the 32 KiB that
 *   Q_i gives back hold a third ring stage (32 + 3 x 64 = 224 KiB). Everything else is the
 *   stage's: Bc = 128, four stages and the turned loop at d = 64, not turned at d = 128; d = 256
 *   has two consumer warpgroups in the stage already and runs its configuration unchanged.
 * What it measures: what the third warpgroup buys, each K/V tile copied (and each wait on it)
 *   serving 192 query rows instead of 128 (notes/12_warp_specialized.md, "Tried, and why it lost").
 * Run: make ablations && bench/ablations/12_two_warpgroups --batch 4 --heads 16 --seqlen 4096 --dim 128
 */
#include "stages/12_warp_specialized.cu"
#include "common/ablation.h"

namespace {

/* The stage's configuration (stages/12_warp_specialized.cu, cfg) with NWARPGROUPS = 2 */
template <int HeadDim>
struct two_warpgroups : cfg<HeadDim> {}; /* d = 256: the stage's own, two warpgroups already */
template <>
struct two_warpgroups<64> { static constexpr int HeadDim = 64, NWARPGROUPS = 2, Bc = 128, STAGES = 4, TURNED = 1; };
template <>
struct two_warpgroups<128> { static constexpr int HeadDim = 128, NWARPGROUPS = 2, Bc = 128, STAGES = 3, TURNED = 0; };

} // namespace

ABLATION(12_two_warpgroups, stage12_desc, "stage12-two-warpgroups",
         "stage 12 with two consumer warpgroups (Br = 128) at d = 64 and 128 instead of three",
         forward<two_warpgroups>, NULL, NULL)
