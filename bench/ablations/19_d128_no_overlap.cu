/* 19_d128_no_overlap.cu: stage 19 at d = 128 with the turns but without the overlap: each warpgroup
 * issues P_ij V_j and S_{i,j+1} in its turn and waits for both before the softmax, instead of
 * computing the softmax of S_{i,j+1} while P_ij V_j runs. The companion of 19_d128_three_wg (which
 * needs it to fit its registers): what the overlap itself is worth at d = 128 in FP8. Other head
 * dims as the stage. Run: make ablations &&
 * bench/ablations/19_d128_no_overlap --dtype fp8 --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct d128_no_overlap : cfg<HeadDim> {};
template <>
struct d128_no_overlap<128> : cfg<128> { static constexpr int OVERLAP = 0; };
} // namespace

ABLATION(19_d128_no_overlap, stage19_desc, "stage19-d128-no-overlap", "stage 19 at d = 128 without the overlap",
         forward<d128_no_overlap>, NULL, tiles_for<d128_no_overlap>)
