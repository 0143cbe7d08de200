/* timing.c: a monotonic wall clock for CPU stages, and the median/minimum of repeated runs. */
#include "harness.h"
#include <stdlib.h>
#include <time.h>

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double median_min(double *t, int n, double *min)
{
    qsort(t, (size_t)n, sizeof *t, cmp_double);
    *min = t[0];
    return n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
}
