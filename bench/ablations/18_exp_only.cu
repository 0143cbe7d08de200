/* 18_exp_only.cu: a floor, not an ablation that still computes attention: stage 18 with a softmax
 * that is nothing but its exponentials and their row sums (18_exp_only.cuh's, for POLY_EVERY = -k
 * in the configuration: P = exp2 of the scaled score, l += rowsum(P), no row max, no rescale, so the output
 * is wrong and the check fails; time it with --no-check). Every score's exponential is still computed, as any softmax must: on MUFU,
 * with every k-th n8 tile by the polynomial, k the stage's share (8 at d = 64, none at d = 128 and
 * 256). 18_exp_only_mufu.cu is the same floor with every exponential on MUFU. The matmuls, the
 * pipeline and the turns run as in the stage. What it measures: the most any softmax that computes
 * every exponential could reach in this kernel; if even the faster of the two floors stays under a
 * target speed, the target is out of this kernel's reach. Run: make ablations &&
 * bench/ablations/18_exp_only --no-check --batch 4 --heads 32 --seqlen 4096 --dim 64 */
#include "stages/18_exp2_two_pipes.cu"
#include "bench/ablations/18_exp_only.cuh"
#include "common/ablation.h"

namespace {
/* -k: every k-th n8 tile by the polynomial; -64 (more n8 tiles than a tile has): none */
template <int HeadDim>
struct exp_only : cfg<HeadDim> { static constexpr int POLY_EVERY = cfg<HeadDim>::POLY_EVERY > 0 ? -cfg<HeadDim>::POLY_EVERY : -64; };
} // namespace

ABLATION(18_exp_only, stage18_desc, "stage18-exp-only",
         "stage 18 with a softmax of its exponentials alone, the stage's polynomial share (a floor; its output is wrong)",
         forward<exp_only>, NULL, NULL)
