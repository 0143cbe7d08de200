/* 14_two_warpgroups.cu: stage 14 at d = 64 with two consumer warpgroups (Br = 128) instead of
 * three (Br = 192); d = 128 and 256 as in stage 14. Three warpgroups share each K/V tile among
 * more rows; two waste fewer rows where N is short: at N = 1024 the last of six 192-row Q tiles
 * holds 64 queries, and under a causal mask the 192-row tiles reach further past the diagonal.
 * Timed beside stage 14 by bench/ablate.sh. */
#include "stages/14_persistent.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct two_wg : cfg<HeadDim> { static constexpr int NWARPGROUPS = HeadDim == 64 ? 2 : cfg<HeadDim>::NWARPGROUPS; };
} // namespace

ABLATION(14_two_warpgroups, stage14_desc, "stage14-two-warpgroups", "stage 14 with two consumer warpgroups at d = 64",
         forward<two_wg>, NULL, tiles_for<two_wg>)
