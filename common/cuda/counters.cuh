/* counters.cuh: the tallies a kernel's counting build keeps for --counters.
 *
 * A stage's kernel takes `bool COUNT` as a template parameter: the build the harness times has
 * COUNT = false and none of this code; the counting build (launched when args.counters is set)
 * tallies the work it does on O as it does it. Each thread counts in registers and adds its totals
 * to the device counters once, at the end, so counting does not serialize the kernel.
 */
#ifndef COUNTERS_CUH
#define COUNTERS_CUH

#include "common/attn.h"

template <bool COUNT>
struct work_tally {
    unsigned n[N_COUNTERS] = {};

    /* one event of kind c (enum counter in attn.h) */
    __device__ __forceinline__ void add(int c)
    {
        if constexpr (COUNT) n[c]++;
    }
    /* this thread's totals into the device counters */
    __device__ __forceinline__ void flush(unsigned long long *counters)
    {
        if constexpr (COUNT) {
#pragma unroll
            for (int c = 0; c < N_COUNTERS; c++)
                if (n[c]) atomicAdd(&counters[c], (unsigned long long)n[c]);
        }
    }
};

#endif
