/* mem.h: scratch memory for CPU stages, tracked so the summary can report the peak a stage
 * allocated beyond its inputs and outputs (thread-safe: stages allocate per OpenMP thread). */
#ifndef MEM_H
#define MEM_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Like malloc, but counted; never returns NULL (exits with a message when memory runs out). */
void *mem_alloc(size_t bytes);
void mem_free(void *p);
#ifdef __cplusplus
}
#endif
#endif
