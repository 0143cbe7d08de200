/* 19_quant_only.cu: stage 19's quantization alone (Q and K through the Hadamard transform unless
 * --hadamard 0, V transposed and permuted, each to e4m3 with its scales), not the attention: its
 * time is the part of stage 19's forward that the 16-bit stages do not have. O is never written,
 * so the check fails; time it with --no-check. Run: make ablations && bench/ablations/19_quant_only
 * --no-check --dtype fp8 --batch 4 --heads 16 --seqlen 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
int quant_only(const struct attn_args *a, char *why, size_t n) { return forward<cfg, false>(a, why, n); }
} // namespace

ABLATION(19_quant_only, stage19_desc, "stage19-quant-only", "stage 19's quantization kernels alone (O not written)",
         quant_only, NULL, NULL)
