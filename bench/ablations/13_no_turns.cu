/* 13_no_turns.cu: stage 13 without the turns. The consumer warpgroups issue their wgmma whenever
 * they are ready, as in stage 12, each still with its softmax under its own P V (the kernel's
 * PINGPONG = 0): the intra-warpgroup overlap alone. d = 256 has neither; it runs as in stage 13.
 * Timed beside stage 13 by bench/ablate.sh. */
#include "stages/13_pingpong.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct no_turns : cfg<HeadDim> { static constexpr int PINGPONG = 0; };
} // namespace

ABLATION(13_no_turns, stage13_desc, "stage13-no-turns", "stage 13 without the turns (the softmax under P V alone)",
         forward<no_turns>, NULL, NULL)
