/* common_test.h: what the Criterion suites share (defined once, in tests/common_test.c).
 *
 * The suites are linked into one binary with every stage and the harness, so everything here
 * carries a test_ prefix. Criterion runs each test in a child process it starts afresh, so a
 * parameter holds plain values only (a stage is named by its index in all_stages[], not by an
 * address), and CUDA is touched only inside a test body.
 */
#ifndef COMMON_TEST_H
#define COMMON_TEST_H

#include "common/harness.h"
#include <criterion/criterion.h>
#include <criterion/parameterized.h>

/* One forward case: a stage, a shape, the dtype it runs in and the input amplitude. */
struct test_case {
    int stage;        /* index into all_stages[] */
    struct shape sh;
    enum dtype dtype;
    float amplitude;  /* inputs drawn from [-amplitude, amplitude] */
};

#define TEST_COUNT(a) (sizeof(a) / sizeof *(a))

/* A shape with the default softmax scale 1/sqrt(d). */
struct shape test_shape(int B, int H, int N, int d, int causal);
/* The same with a KV cache: K and V [B, H_kv, N_kv, d]. */
struct shape test_kv_shape(int B, int H, int H_kv, int N, int N_kv, int d, int causal);
/* "stage3 B=2 H=3 N=17 d=64 causal fp32 x1" (and " Hkv=2 Nkv=1000 splits=3" where they apply), for assertion messages (Criterion does not print which
 * parameter failed, so every message names its case). */
void test_label(const struct test_case *tc, char *buf, size_t n);
/* A seed derived from the shape: each case its own inputs, the same on every run. */
uint64_t test_seed(const struct shape *sh);

/* Skips the running test with a one-line reason unless a usable CUDA device is present. */
void test_require_gpu(void);
/* The same, and unless that device is of compute capability arch_sm (10 * major + minor; 0: any),
 * `who` naming what needs it in the reason ("stage11", "the wgmma tests"). */
void test_require_gpu_arch(int arch_sm, const char *who);

/* After test_require_gpu: skips the running test with a one-line reason where this device (with
 * ATTN_SMEM_CAP_KB's cap, if set) cannot run `st` on this problem: bf16 where the code running is
 * Turing's (sm_75), or no tile configuration of the stage fits the shared memory a block may have
 * (the stage would refuse it with exit 2, as designed). `backward`: the stage's backward. */
void test_require_fit(const struct stage *st, const struct shape *sh, enum dtype dt, int deterministic,
                      int backward);
/* Whether the GPU grids take `st`: every stage, unless ATTN_TEST_STAGES lists some ("4-10",
 * "9,10", "4-8,10": stage numbers and ranges). Criterion's --filter cannot pick parameters, so a
 * run under a cap (ATTN_SMEM_CAP_KB) leaves the Hopper stages out this way. */
int test_stage_selected(const struct stage *st);

/* The stage called `name` in all_stages[] (the test fails if there is none), and the number in
 * a stage's name ("stage4" -> 4). */
const struct stage *test_find_stage(const char *name);
/* the same, NULL where this build has no such stage (stage 20 without NCCL) */
const struct stage *test_lookup_stage(const char *name);
int test_stage_number(const struct stage *st);

/* malloc that fails the test instead of returning NULL; fp32 to fp64 copies for compare(). */
float *test_floats(size_t n);
double *test_doubles(size_t n);
double *test_widen(const float *x, size_t n);
void test_poison(float *x, size_t n);

/* The cleanup of every cr_malloc'd parameter array. */
void test_free_params(struct criterion_test_params *p);

/* One line naming the worst element of a comparison, as cmp_print writes it:
 * "O: FAIL worst at [b=1 h=2 i=16 c=3] got .. want .. | max_err .. mean_err .. tol .. nonfinite k of n" */
void test_cmp_text(char *buf, size_t n, const char *what, const struct cmp *c, const struct shape *sh,
                   int is_rows);

/* The one assert per array: passes when compare() passed, else names the worst element. */
#define TEST_ASSERT_CMP(label, what, c, sh, is_rows)                                          \
    do {                                                                                      \
        char msg_[512];                                                                       \
        test_cmp_text(msg_, sizeof msg_, (what), &(c), (sh), (is_rows));                      \
        cr_assert((c).pass, "%s: %s", (label), msg_);                                         \
    } while (0)

#endif
