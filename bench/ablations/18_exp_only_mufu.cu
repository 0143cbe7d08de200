/* 18_exp_only_mufu.cu: the floor of 18_exp_only.cu (a softmax of its exponentials and their row sums
 * alone: no row max, no rescale; a wrong result, timed with --no-check) with every exponential on MUFU, none
 * by the polynomial. Of the two floors the faster is the bound: the polynomial's share trades MUFU
 * time for FMA-pipe time and instruction issue, and which one wins is what the pair measures. Run:
 * make ablations && bench/ablations/18_exp_only_mufu --no-check --batch 4 --heads 32 --seqlen 4096 --dim 64 */
#include "stages/18_exp2_two_pipes.cu"
#include "bench/ablations/18_exp_only.cuh"
#include "common/ablation.h"

namespace {
/* -64: more n8 tiles than a tile has, so none by the polynomial */
template <int HeadDim>
struct exp_only_mufu : cfg<HeadDim> { static constexpr int POLY_EVERY = -64; };
} // namespace

ABLATION(18_exp_only_mufu, stage18_desc, "stage18-exp-only-mufu",
         "stage 18 with a softmax of its exponentials alone, all on MUFU (a floor; its output is wrong)",
         forward<exp_only_mufu>, NULL, NULL)
