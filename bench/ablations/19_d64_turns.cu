/* 19_d64_turns.cu: stage 19 at d = 64 as stage 18 runs it: the three consumer warpgroups take turns
 * at the tensor cores, and an eighth of the exponentials go to the FMA pipe. The stage drops both
 * at d = 64; this is what it was before. Other head dims as the stage. Run: make ablations &&
 * bench/ablations/19_d64_turns --dtype fp8 --batch 4 --heads 32 --seqlen 4096 --dim 64 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct d64_turns : cfg<HeadDim> {};
template <>
struct d64_turns<64> : cfg<64> { static constexpr int PINGPONG = 1, POLY_EVERY = 8; };
} // namespace

ABLATION(19_d64_turns, stage19_desc, "stage19-d64-turns", "stage 19 at d = 64 with the turns and an eighth on the polynomial",
         forward<d64_turns>, NULL, tiles_for<d64_turns>)
