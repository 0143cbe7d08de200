/* 19_three_stages.cu: stage 19 at d = 256 with three ring stages instead of two (32 + 3 x 64 KiB of
 * tiles, 224 KiB with the barriers, under the 227 a block may have): at d = 256 the loop is not
 * turned, so a K/V tile's copy has only one other stage to hide behind. Other head dims as the
 * stage. Run: make ablations && bench/ablations/19_three_stages --dtype fp8 --batch 2 --heads 8
 * --seqlen 8192 --dim 256 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct three_stages : cfg<HeadDim> {};
template <>
struct three_stages<256> : cfg<256> { static constexpr int STAGES = 3; };
} // namespace

ABLATION(19_three_stages, stage19_desc, "stage19-three-stages", "stage 19 with three ring stages at d = 256",
         forward<three_stages>, NULL, tiles_for<three_stages>)
