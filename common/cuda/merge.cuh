/* merge.cuh: the merge of partial attention results by their logsumexp, written once. A row's
 * softmax over all its keys, computed in parts (slices of a KV cache in stage 15, the K/V blocks
 * of the ring in stage 20), each part s giving O_s (normalized by its own sum) and its logsumexp
 * L_s (nats), is put back together as the online softmax does across tiles:
 *   m = max_s L_s,  w_s = exp(L_s - m)  ( = l_s exp(m_s - m) / exp(m): part s's share)
 *   O = sum_s w_s O_s / sum_s w_s,  L = m + log sum_s w_s
 * A part that saw no key has L_s = -inf and weighs 0; a row whose parts all saw none (m = -inf)
 * keeps L = -inf and O = 0 (the caller's 1 / sum_s w_s is 0 there), never NaN. */
#ifndef ATTN_CUDA_MERGE_CUH
#define ATTN_CUDA_MERGE_CUH

#include "common/cuda/defs.cuh"
#include "common/cuda/mma.cuh"
#include <math.h>

/* w_s = exp(L_s - m), by exp2 on the MUFU unit; 0 for every part of a row with m = -inf */
static __device__ __forceinline__ float lse_weight(float L_s, float m)
{
    return m == -INFINITY ? 0.f : exp2_approx((L_s - m) * LOG2E);
}

/* L = m + log sum_s w_s (nats), -inf where no part saw a key */
static __device__ __forceinline__ float lse_merged(float m, float sum_w)
{
    return m == -INFINITY ? -INFINITY : m + logf(sum_w);
}

#endif
