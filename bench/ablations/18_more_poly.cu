/* 18_more_poly.cu: stage 18 with more of its exponentials on the FMA pipe: every 4th n8 tile of S's
 * columns by the polynomial at d = 64 (stage 18: every 8th); at d = 128, where stage 18 takes none,
 * every 16th (r = 1/16, one n8 tile of a row's sixteen: the smallest share there); d = 256 as in
 * stage 18 (none). With 18_less_poly and stage 17 (no share), the sweep that chooses stage 18's
 * POLY_EVERY. Timed beside stage 18 by bench/ablate.sh. */
#include "stages/18_exp2_two_pipes.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct more_poly : cfg<HeadDim> {
    static constexpr int POLY_EVERY = cfg<HeadDim>::POLY_EVERY > 0 ? cfg<HeadDim>::POLY_EVERY / 2 : HeadDim == 128 ? 16 : 0;
};
} // namespace

ABLATION(18_more_poly, stage18_desc, "stage18-more-poly",
         "stage 18 with more of exp2 on the polynomial (twice at d = 64, 1/16 at d = 128)", forward<more_poly>, NULL, NULL)
