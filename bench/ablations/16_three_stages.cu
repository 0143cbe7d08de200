/* 16_three_stages.cu: stage 16 at d = 128 with a ring of three stages of Q_i, dO_i, L_i, D_i
 * instead of two (225.5 KiB of shared memory, what an H100 or H200 block can have; d = 64 has no
 * room for a third: 227 KiB and its barriers). The producer then runs two Q tiles ahead of the
 * consumers instead of one: what it measures is whether a Q tile's copy is ever late. Timed beside
 * stage 16 by bench/ablate.sh. */
#include "stages/16_hopper_backward.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct three_stages : cfg<HeadDim> { static constexpr int STAGES = HeadDim == 128 ? 3 : cfg<HeadDim>::STAGES; };
} // namespace

ABLATION(16_three_stages, stage16_desc, "stage16-three-stages", "stage 16 with three ring stages at d = 128",
         NULL, backward<three_stages>, tiles_for<three_stages>)
