/* 18_less_poly.cu: stage 18 with half its share of exponentials on the FMA pipe: every 16th n8 tile
 * of S's columns by the polynomial at d = 64 (stage 18: every 8th; one n8 tile of a row's sixteen);
 * d = 128 and 256 as in stage 18 (none). Timed beside stage 18 by bench/ablate.sh. */
#include "stages/18_exp2_two_pipes.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct less_poly : cfg<HeadDim> { static constexpr int POLY_EVERY = cfg<HeadDim>::POLY_EVERY * 2; };
} // namespace

ABLATION(18_less_poly, stage18_desc, "stage18-less-poly", "stage 18 with half the polynomial's share of exp2",
         forward<less_poly>, NULL, NULL)
