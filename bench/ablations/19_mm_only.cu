/* 19_mm_only.cu: a floor below 19_free_exp: stage 19 with no softmax at all (POLY_EVERY =
 * FLOOR_NO_SOFTMAX: no row maxima, no exponentials, no sums, no rescaling; the scores go into P V
 * as they are, so the output is wrong and the check fails; time it with --no-check). What is left
 * is what any FP8 forward with these tiles must do: the quantization, Q K^T and P V on the tensor
 * cores, P packed into e4m3, the copies and the pipeline. If a target is past even this floor, no
 * change to the softmax reaches it. Run: make ablations && bench/ablations/19_mm_only --dtype fp8
 * --no-check --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct mm_only : cfg<HeadDim> { static constexpr int POLY_EVERY = FLOOR_NO_SOFTMAX; };
} // namespace

ABLATION(19_mm_only, stage19_desc, "stage19-mm-only", "stage 19 with no softmax (a floor; its output is wrong)",
         forward<mm_only>, NULL, NULL)
