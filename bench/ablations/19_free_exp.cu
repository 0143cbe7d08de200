/* 19_free_exp.cu: a floor, not an ablation that still computes attention: stage 19 with no
 * exponential of a score (POLY_EVERY = FLOOR_NO_EXP: P is the exponent's absolute value, so the
 * output is wrong and the check fails; time it with --no-check). Everything else runs as in the
 * stage: the quantization, the matmuls, the pipeline, the turns, the row maxima and sums. What it
 * measures: the most that any way of computing the exponentials could buy in FP8, where the matmuls
 * take half as long as in fp16 and the softmax does not shrink. Run: make ablations &&
 * bench/ablations/19_free_exp --dtype fp8 --no-check --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct free_exp : cfg<HeadDim> { static constexpr int POLY_EVERY = FLOOR_NO_EXP; };
} // namespace

ABLATION(19_free_exp, stage19_desc, "stage19-free-exp", "stage 19 with no exponentials (a floor; its output is wrong)",
         forward<free_exp>, NULL, NULL)
