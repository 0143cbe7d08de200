/* 19_no_turns.cu: stage 19 at d = 128 without the turns (PINGPONG = 0), the loop still turned and
 * the softmax still under the same warpgroup's P V: the two consumer warpgroups issue their wgmma
 * whenever they are ready, as stage 12's do. The stage dropped the turns at d = 64, where this
 * measured 5 to 8% faster, and has none at d = 256; at d = 128 it measured within 1.5%. Run: make
 * ablations && bench/ablations/19_no_turns --dtype fp8 --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct no_turns : cfg<HeadDim> { static constexpr int PINGPONG = 0; };
} // namespace

ABLATION(19_no_turns, stage19_desc, "stage19-no-turns", "stage 19 without the turns between warpgroups",
         forward<no_turns>, NULL, tiles_for<no_turns>)
