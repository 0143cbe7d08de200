/* 19_more_poly.cu: stage 19 with twice stage 18's share of exponentials on the FMA pipe (d = 64: a
 * quarter, d = 128: an eighth, d = 256: a sixteenth, where the stage has none). In FP8 the matmuls
 * take half as long and the softmax does not shrink, so MUFU's share of a round grows: the share
 * that balanced the pipes in fp16 may be too small here. Run: make ablations &&
 * bench/ablations/19_more_poly --dtype fp8 --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct more_poly : cfg<HeadDim> { static constexpr int POLY_EVERY = HeadDim == 64 ? 4 : HeadDim == 128 ? 8 : 16; };
} // namespace

ABLATION(19_more_poly, stage19_desc, "stage19-more-poly", "stage 19 with twice stage 18's polynomial share",
         forward<more_poly>, NULL, NULL)
