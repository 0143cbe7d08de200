/* 19_no_poly.cu: stage 19 at d = 128 with every exponential on MUFU (POLY_EVERY = 0; the stage puts
 * a sixteenth on the FMA pipe there, and none at d = 64, where an eighth measured 3 to 6% slower,
 * or 256). Stage 18 measured no share faster than none in 16-bit on an H200; in FP8 the matmuls
 * take half as long and MUFU's time does not shrink. Run: make ablations &&
 * bench/ablations/19_no_poly --dtype fp8 --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct no_poly : cfg<HeadDim> { static constexpr int POLY_EVERY = 0; };
} // namespace

ABLATION(19_no_poly, stage19_desc, "stage19-no-poly", "stage 19 with every exponential on MUFU",
         forward<no_poly>, NULL, NULL)
