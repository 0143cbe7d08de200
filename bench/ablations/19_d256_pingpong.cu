/* 19_d256_pingpong.cu: stage 19 at d = 256 with the two consumer warpgroups also taking turns at the
 * tensor cores (PINGPONG) on top of the stage's turned loop with the overlap. Other head dims as the
 * stage. Run: make ablations &&
 * bench/ablations/19_d256_pingpong --dtype fp8 --batch 1 --heads 8 --seqlen 16384 --dim 256 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct d256_pingpong : cfg<HeadDim> {};
template <>
struct d256_pingpong<256> : cfg<256> { static constexpr int PINGPONG = 1; };
} // namespace

ABLATION(19_d256_pingpong, stage19_desc, "stage19-d256-pingpong", "stage 19 at d = 256 with the turns",
         forward<d256_pingpong>, NULL, tiles_for<d256_pingpong>)
