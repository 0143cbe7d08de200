/* 16_dq_atomics.cu: stage 16 with stage 10's dQ path: each consumer thread adds its piece of dQ_i
 * from its registers into the fp32 accumulator in HBM by float2 atomics (16 per thread and Q
 * tile), instead of staging the tile in shared memory for the dQ writer's one bulk reduce-add.
 * Everything else is stage 16's. Without --deterministic only (atomics have no order). Timed
 * beside stage 16 by bench/ablate.sh. */
#include "stages/16_hopper_backward.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct atomics : cfg<HeadDim> { static constexpr int DQ_ATOMICS = 1; };
} // namespace

ABLATION(16_dq_atomics, stage16_desc, "stage16-dq-atomics", "stage 16 with dQ added by float2 atomics (stage 10's way)",
         NULL, backward<atomics>, tiles_for<atomics>)
