/* 19_max_exp.cu: a floor, not an ablation that still computes attention: stage 19 whose online
 * softmax keeps the row maxima, every exponential (on MUFU) and the sums, but never rescales O_i
 * (POLY_EVERY = FLOOR_NO_RESCALE), so the output is wrong where a row's max rises after its first
 * tile and the check fails; time it with --no-check. Between 19_mm_only (no softmax) and the stage
 * (the vote's rescales on top of it): the quantization, both matmuls and what any online softmax
 * must do with these tiles. Run: make ablations && bench/ablations/19_max_exp --dtype fp8
 * --no-check --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct max_exp : cfg<HeadDim> { static constexpr int POLY_EVERY = FLOOR_NO_RESCALE; };
} // namespace

ABLATION(19_max_exp, stage19_desc, "stage19-max-exp",
         "stage 19 with an online softmax that never rescales O (a floor; its output is wrong)",
         forward<max_exp>, NULL, NULL)
