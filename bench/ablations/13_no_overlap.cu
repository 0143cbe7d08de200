/* 13_no_overlap.cu: stage 13 without the softmax under its own P V. In its turn a warpgroup issues
 * O_i += P_ij V_j and S_{i,j+1} = Q_i K_{j+1}^T, waits for both, and only then computes the softmax
 * of S_{i,j+1} (the kernel's OVERLAP = 0): the turns alone. d = 256 has neither; it runs as in
 * stage 13. Timed beside stage 13 by bench/ablate.sh. */
#include "stages/13_pingpong.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct no_overlap : cfg<HeadDim> { static constexpr int OVERLAP = 0; };
} // namespace

ABLATION(13_no_overlap, stage13_desc, "stage13-no-overlap", "stage 13, the softmax after P V (the turns alone)",
         forward<no_overlap>, NULL, NULL)
