/* gpu.h: the device query and device buffers, used by the runner (runner.cu) and the GPU tests; the
 * stages never allocate or query the device themselves. */
#ifndef GPU_H
#define GPU_H
#include "common/cuda/cuda_check.h"
#include <stddef.h>

struct gpu_info {
    char name[256];
    char slug[64];       /* "h200": the name the benchmark's CSV file and column use */
    int l2_bytes;        /* --flush-l2 reads twice this before each timed run */
};
/* The current device's properties (exits with a message if there is none). */
struct gpu_info gpu_query(void);

/* A device allocation that knows its size. */
struct dbuf {
    void *p;
    size_t bytes;
};
struct dbuf dbuf_alloc(size_t bytes);
void dbuf_free(struct dbuf *b);

#endif
