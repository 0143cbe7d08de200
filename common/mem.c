/* mem.c: the tracked scratch allocator behind mem.h. Each block carries its size in a header so
 * that mem_free can subtract it; current and peak are updated atomically. */
#include "mem.h"
#include "harness.h"
#include <stdio.h>
#include <stdlib.h>

#define MEM_HEADER 64 /* keeps the caller's pointer 64-byte aligned (a cache line) */

static size_t mem_current, mem_peak;

void *mem_alloc(size_t bytes)
{
    char *p = aligned_alloc(MEM_HEADER, MEM_HEADER + CEIL_DIV(bytes, MEM_HEADER) * MEM_HEADER);
    if (!p) {
        fprintf(stderr, "out of memory allocating %zu bytes of scratch\n", bytes);
        exit(EXIT_USAGE);
    }
    *(size_t *)p = bytes;
    size_t now = __atomic_add_fetch(&mem_current, bytes, __ATOMIC_RELAXED);
    size_t peak = __atomic_load_n(&mem_peak, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&mem_peak, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
        ;
    return p + MEM_HEADER;
}

void mem_free(void *ptr)
{
    if (!ptr) return;
    char *p = (char *)ptr - MEM_HEADER;
    __atomic_sub_fetch(&mem_current, *(size_t *)p, __ATOMIC_RELAXED);
    free(p);
}

size_t mem_peak_bytes(void) { return __atomic_load_n(&mem_peak, __ATOMIC_RELAXED); }
void mem_reset_peak(void) { __atomic_store_n(&mem_peak, __atomic_load_n(&mem_current, __ATOMIC_RELAXED), __ATOMIC_RELAXED); }
