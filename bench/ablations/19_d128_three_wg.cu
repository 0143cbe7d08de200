/* 19_d128_three_wg.cu: stage 19 at d = 128 with three consumer warpgroups (Br = 192) instead of two.
 * At d = 128 the measured round is bound by each warp's softmax latency (Nsight Compute: tensor
 * cores 41% busy, MUFU 43%, issue 45%, about 5 cycles between a warp's instructions), and a third
 * warp per scheduler gives the schedulers another softmax to issue from. The registers a thread
 * has drop from 240 to 160: O 64 + S 64 + P 16 hold without the overlap (P_ij and the next S are
 * not live together), so the loop is turned with the turns but without the overlap. Other head
 * dims as the stage. Run: make ablations &&
 * bench/ablations/19_d128_three_wg --dtype fp8 --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct d128_three_wg : cfg<HeadDim> {};
template <>
struct d128_three_wg<128> : cfg<128> { static constexpr int NWARPGROUPS = 3, OVERLAP = 0; };
} // namespace

ABLATION(19_d128_three_wg, stage19_desc, "stage19-d128-three-wg", "stage 19 at d = 128 with three consumer warpgroups",
         forward<d128_three_wg>, NULL, tiles_for<d128_three_wg>)
