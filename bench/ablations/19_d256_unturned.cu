/* 19_d256_unturned.cu: stage 19 at d = 256 as stage 18 runs it, the loop not turned: each P V
 * waited for at once, the softmax left to the schedulers, two ring stages (32 + 2 x 64 KiB). The
 * stage turns the loop with the overlap at d = 256 and takes a third stage; this is what it was
 * before. Other head dims as the stage. Run: make ablations &&
 * bench/ablations/19_d256_unturned --dtype fp8 --batch 1 --heads 8 --seqlen 16384 --dim 256 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct d256_unturned : cfg<HeadDim> {};
template <>
struct d256_unturned<256> : cfg<256> { static constexpr int STAGES = 2, TURNED = 0, PINGPONG = 0, OVERLAP = 0; };
} // namespace

ABLATION(19_d256_unturned, stage19_desc, "stage19-d256-unturned", "stage 19 at d = 256 without the turned loop",
         forward<d256_unturned>, NULL, tiles_for<d256_unturned>)
