/* 19_d256_overlap.cu: stage 19 at d = 256 with its loop turned and the softmax of the next S under the
 * current P V (FlashAttention-3's intra-warpgroup overlap, stage 13's OVERLAP), three ring stages (32 + 3 x 64 KiB). In fp16 the
 * softmax at d = 256 is a quarter of the matmuls' time and the stage leaves its overlap to the
 * schedulers; in FP8 the matmuls halve and it is half, as at d = 128 in fp16, where the overlap
 * paid. Other head dims as the stage. Run: make ablations &&
 * bench/ablations/19_d256_overlap --dtype fp8 --batch 1 --heads 8 --seqlen 16384 --dim 256 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct d256_overlap : cfg<HeadDim> {};
template <>
struct d256_overlap<256> : cfg<256> { static constexpr int STAGES = 3, TURNED = 1, PINGPONG = 0, OVERLAP = 1; };
} // namespace

ABLATION(19_d256_overlap, stage19_desc, "stage19-d256-overlap", "stage 19 at d = 256 turned, with the overlap",
         forward<d256_overlap>, NULL, tiles_for<d256_overlap>)
