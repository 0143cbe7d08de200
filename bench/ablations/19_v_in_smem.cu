/* 19_v_in_smem.cu: stage 19 with V transposed in shared memory instead of by the quantization
 * kernel (d = 128 and 256; d = 64 as the stage). The quantization writes V8 as it writes K8, rows of
 * keys; the producer copies V_j like K_j, and its three idle warps transpose each ring stage's V_j
 * into V_j^T with the keys permuted (transpose_v), 4 x 4 bytes a thread by byte permutes, then
 * hand it to the consumers through vt_full[s]. What it measures: whether moving the transpose out
 * of the quantization pass (where V's bytes must be scattered through shared memory anyway) and
 * into the attention kernel (where it takes issue slots beside the consumers' softmax) pays.
 * At d = 256 the raw V_j takes shared memory the stage's third ring stage would use: there it runs
 * the loop not turned, on two stages (19_d256_unturned's configuration), as when it was measured.
 * Run: make ablations && bench/ablations/19_v_in_smem --dtype fp8 --batch 4 --heads 16 --seqlen
 * 4096 --dim 128 */
#include "stages/19_fp8.cu"
#include "common/ablation.h"

namespace {
template <int HeadDim>
struct v_in_smem : cfg<HeadDim> { static constexpr int V_IN_SMEM = HeadDim >= 128; };
template <>
struct v_in_smem<256> : cfg<256> { static constexpr int V_IN_SMEM = 1, STAGES = 2, TURNED = 0, OVERLAP = 0; };
} // namespace

ABLATION(19_v_in_smem, stage19_desc, "stage19-v-in-smem", "stage 19 with V transposed in shared memory",
         forward<v_in_smem>, NULL, tiles_for<v_in_smem>)
