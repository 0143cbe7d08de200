/* common_test.c: the helpers declared in common_test.h. No tests here. */
#include "common_test.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

struct shape test_shape(int B, int H, int N, int d, int causal)
{
    return (struct shape){.B = B, .H = H, .N = N, .d = d, .causal = causal, .scale = 1.0f / sqrtf((float)d)};
}

void test_label(const struct test_case *tc, char *buf, size_t n)
{
    const struct shape *sh = &tc->sh;
    int k = snprintf(buf, n, "%s B=%d H=%d N=%d d=%d %s %s x%g", all_stages[tc->stage]->name, sh->B, sh->H, sh->N,
                     sh->d, sh->causal ? "causal" : "full", dtype_name(tc->dtype), tc->amplitude);
    if (!shape_is_self(sh) && k > 0 && (size_t)k < n) /* the KV cache, where it is not the queries' own */
        k += snprintf(buf + k, n - k, " Hkv=%d Nkv=%d", shape_kv_heads(sh), shape_kv_len(sh));
    if (sh->splits && k > 0 && (size_t)k < n) snprintf(buf + k, n - k, " splits=%d", sh->splits);
}

struct shape test_kv_shape(int B, int H, int H_kv, int N, int N_kv, int d, int causal)
{
    struct shape sh = test_shape(B, H, N, d, causal);
    sh.H_kv = H_kv, sh.N_kv = N_kv;
    return sh;
}

uint64_t test_seed(const struct shape *sh)
{
    /* (the KV terms vanish for self-attention: the seeds of the square grid are what they were) */
    return 1234 + 7919ull * sh->N + 31ull * sh->d + 2ull * sh->causal + 104729ull * (shape_kv_len(sh) - sh->N) +
           13ull * (sh->H - shape_kv_heads(sh));
}

void test_require_gpu(void)
{
    char why[256];
    if (!gpu_available) cr_skip_test("built without CUDA");
    if (gpu_available(why, sizeof why)) cr_skip_test("%s", why);
}

void test_require_gpu_arch(int arch_sm, const char *who)
{
    char why[256];
    test_require_gpu();
    if (gpu_arch_check(arch_sm, who, why, sizeof why)) cr_skip_test("%s", why);
}

void test_require_fit(const struct stage *st, const struct shape *sh, enum dtype dt, int deterministic, int backward)
{
    char why[256];
    if (!gpu_dtype_check || !gpu_smem_limit) cr_skip_test("built without CUDA");
    if (gpu_dtype_check(dt, st->name, why, sizeof why)) cr_skip_test("%s", why);
    if (!st->tiles) return;
    struct attn_args a = {.sh = *sh, .dtype = dt, .deterministic = deterministic};
    struct tile_config c;
    if (st->tiles(&a, backward, gpu_smem_limit(), &c)) cr_skip_test("%s: %s", st->name, c.text);
}

int test_stage_selected(const struct stage *st)
{
    const char *s = getenv("ATTN_TEST_STAGES");
    if (!s || !*s) return 1;
    const int num = test_stage_number(st);
    while (*s) {
        char *end;
        long lo = strtol(s, &end, 10), hi = lo;
        if (end == s) break;
        if (*end == '-') {
            const char *h = end + 1;
            hi = strtol(h, &end, 10);
            if (end == h) break;
        }
        if (num >= lo && num <= hi) return 1;
        if (*end == 0) return 0;
        if (*end != ',') break;
        s = end + 1;
    }
    fprintf(stderr, "ATTN_TEST_STAGES=%s: expected stage numbers and ranges, as 4-10 or 4-8,10\n",
            getenv("ATTN_TEST_STAGES"));
    exit(2);
}

const struct stage *test_lookup_stage(const char *name)
{
    for (int s = 0; s < n_all_stages; s++)
        if (!strcmp(all_stages[s]->name, name)) return all_stages[s];
    return NULL;
}

const struct stage *test_find_stage(const char *name)
{
    const struct stage *st = test_lookup_stage(name);
    if (!st) cr_assert_fail("%s is not in all_stages[] (the Makefile's list of stages)", name);
    return st;
}

int test_stage_number(const struct stage *st)
{
    int num = 0;
    return sscanf(st->name, "stage%d", &num) == 1 ? num : 0;
}

static void *test_alloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    cr_assert(p != NULL, "out of memory (%zu bytes)", bytes);
    return p;
}

float *test_floats(size_t n) { return test_alloc(n * sizeof(float)); }
double *test_doubles(size_t n) { return test_alloc(n * sizeof(double)); }

double *test_widen(const float *x, size_t n)
{
    double *y = test_doubles(n);
    for (size_t k = 0; k < n; k++) y[k] = x[k];
    return y;
}

void test_poison(float *x, size_t n)
{
    for (size_t k = 0; k < n; k++) x[k] = NAN; /* an element the stage leaves unwritten fails */
}

void test_free_params(struct criterion_test_params *p) { cr_free(p->params); }

void test_cmp_text(char *buf, size_t n, const char *what, const struct cmp *c, const struct shape *sh,
                   int is_rows)
{
    memset(buf, 0, n); /* the last byte stays 0 however long the line */
    FILE *f = fmemopen(buf, n - 1, "w");
    if (!f) {
        snprintf(buf, n, "%s: max_err %.3g tol %.3g nonfinite %zu", what, c->max_err, c->tol, c->nonfinite);
        return;
    }
    cmp_print(f, what, c, sh, is_rows);
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
}

/* ---- skipped cases: one line per reason after the run ---- */

/* Criterion lists a skipped test only with --verbose, and the synthesis line does not count them:
 * without this, a machine without a GPU would pass the suite without saying what it left out. */
ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    enum { MAX_REASONS = 8 };
    const char *reason[MAX_REASONS], *suite[MAX_REASONS], *example[MAX_REASONS];
    size_t count[MAX_REASONS], nreasons = 0, other = 0;
    for (struct criterion_suite_stats *s = stats->suites; s; s = s->next)
        for (struct criterion_test_stats *t = s->tests; t; t = t->next) {
            /* a test left out by --filter is "skipped" too, without a reason: not worth a line */
            if (t->test_status != CR_STATUS_SKIPPED || !t->message || !*t->message) continue;
            const char *why = t->message;
            size_t r = 0;
            while (r < nreasons && strcmp(reason[r], why)) r++;
            if (r == nreasons && nreasons == MAX_REASONS) { other++; continue; }
            if (r == nreasons) {
                reason[r] = why, suite[r] = t->test->category, example[r] = t->test->name, count[r] = 0;
                nreasons++;
            }
            count[r]++;
        }
    for (size_t r = 0; r < nreasons; r++)
        fprintf(stderr, "[SKIP] %zu test%s skipped (e.g. %s::%s): %s\n", count[r], count[r] == 1 ? "" : "s",
                suite[r], example[r], reason[r]);
    if (other) fprintf(stderr, "[SKIP] %zu more tests skipped for other reasons\n", other);
}
