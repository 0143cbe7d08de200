/* 18_max_exp.cu: a floor, not an ablation that still computes attention: stage 18 with the online
 * softmax of common/cuda/softmax.cuh (the row max, every exponential on MUFU, l_i updated exactly;
 * 18_exp_only.cuh, POLY_EVERY = -128) and no rescale of O ever, so the output is wrong where a row's
 * max rises after its first tiles and the check fails; time it with --no-check. Between
 * 18_exp_only_mufu.cu (no max) and stage 17 (the vote and the rare rescale on top of it): what any
 * online softmax must do, so if it stays under a target speed, that target is out of this kernel's
 * reach. Run: make ablations && bench/ablations/18_max_exp --no-check --batch 4 --heads 32 --seqlen
 * 4096 --dim 64 */
#include "stages/18_exp2_two_pipes.cu"
#include "bench/ablations/18_exp_only.cuh"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct max_exp : cfg<HeadDim> { static constexpr int POLY_EVERY = -128; };
} // namespace

ABLATION(18_max_exp, stage18_desc, "stage18-max-exp",
         "stage 18 with an online softmax that never rescales O, all on MUFU (a floor; its output is wrong)",
         forward<max_exp>, NULL, NULL)
