/* 14_no_early_q.cu: stage 14 at d = 64 with Q_i released after the epilogue, as at d = 128 and 256:
 * O staged through Q_i and stored in 16-byte rows, the next item's Q_i copied only then (the
 * kernel's EARLY_Q = 0). d = 128 and 256 run as in stage 14. Timed beside stage 14 by
 * bench/ablate.sh. */
#include "stages/14_persistent.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct late_q : cfg<HeadDim> { static constexpr int EARLY_Q = 0; };
} // namespace

ABLATION(14_no_early_q, stage14_desc, "stage14-no-early-q", "stage 14, Q_i released after the epilogue at d = 64",
         forward<late_q>, NULL, tiles_for<late_q>)
