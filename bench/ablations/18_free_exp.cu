/* 18_free_exp.cu: a floor, not an ablation that still computes attention: stage 18 with no
 * exponential at all (POLY_EVERY = -1: P is the exponent itself, so the output is wrong and the
 * check fails; time it with --no-check). Everything else runs as in the stage: the matmuls, the
 * pipeline, the turns, the row maxima and sums, the vote. What it measures: the most that any way
 * of computing the exponentials (the polynomial's share, the MUFU unit, anything) could buy at
 * d = 64, where the softmax is the bound. If even this floor stays under a target speed, no
 * exponential trick reaches it. Run: make ablations && bench/ablations/18_free_exp --no-check
 * --batch 4 --heads 32 --seqlen 4096 --dim 64 */
#include "stages/18_exp2_two_pipes.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct free_exp : cfg<HeadDim> { static constexpr int POLY_EVERY = -1; };
} // namespace

ABLATION(18_free_exp, stage18_desc, "stage18-free-exp", "stage 18 with no exponentials (a floor; its output is wrong)",
         forward<free_exp>, NULL, NULL)
