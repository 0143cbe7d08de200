/* defs.cuh: the constants every GPU stage uses, defined once. */
#ifndef DEFS_CUH
#define DEFS_CUH

#define LOG2E 1.4426950408889634f /* exp(x) = exp2(x * LOG2E) */
#define LN2 0.6931471805599453f   /* log(x) = log2(x) * LN2: turns a log2-domain m back into nats */
#define WARP_SIZE 32              /* threads per warp, on every NVIDIA GPU so far */
#define FULL_MASK 0xffffffffu     /* every lane of the warp takes part in a __shfl_*_sync */

#endif
