/* report.c: the one summary line a human reads, and the CSV row the plots are drawn from. */
#include "harness.h"
#include <stdlib.h>

#include "commit.h" /* COMMIT: `git rev-parse --short HEAD` at build time, written by the Makefile */

/* 0 when the C compiler had no OpenMP (the Makefile then builds without it): CPU stages on one thread. */
static int built_with_openmp(void)
{
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}

const char *build_commit(void)
{
    const char *c = getenv("FA_COMMIT"); /* the benchmark may name the commit it measures */
    return c && *c ? c : COMMIT;
}

static void human_bytes(char *buf, size_t n, size_t bytes)
{
    if (bytes < 1024) snprintf(buf, n, "%zu B", bytes);
    else if (bytes < (1u << 20)) snprintf(buf, n, "%.1f KiB", bytes / 1024.0);
    else if (bytes < (1u << 30)) snprintf(buf, n, "%.1f MiB", bytes / 1048576.0);
    else snprintf(buf, n, "%.2f GiB", bytes / 1073741824.0);
}

static double tflops(const struct result *r)
{
    return attn_flops(&r->sh, r->direction[0] == 'b') / (r->ms_median * 1e-3) / 1e12;
}

/* The bytes of K and V a forward must read at least, once each: what a memory-bound stage (one
 * query against a long KV cache) is measured by. 16-bit elements on the GPU, fp32 on the CPU. */
double kv_bytes(const struct shape *sh, enum dtype dt) { return 2.0 * shape_kv_elems(sh) * dtype_size(dt); }

/* "H=32 Hkv=8 N=1 Nkv=16384": the KV side named only where it is not the queries' own */
static void shape_words(char *buf, size_t n, const struct shape *sh)
{
    int k = snprintf(buf, n, "B=%d H=%d", sh->B, sh->H);
    if (shape_kv_heads(sh) != sh->H) k += snprintf(buf + k, n - k, " Hkv=%d", shape_kv_heads(sh));
    k += snprintf(buf + k, n - k, " N=%d", sh->N);
    if (shape_kv_len(sh) != sh->N) k += snprintf(buf + k, n - k, " Nkv=%d", shape_kv_len(sh));
    snprintf(buf + k, n - k, " d=%d", sh->d);
}

void print_summary(FILE *f, const struct result *r)
{
    char extra[32], err[32], shape[128], dtype[48];
    human_bytes(extra, sizeof extra, r->extra_bytes);
    shape_words(shape, sizeof shape, &r->sh);
    /* "fp8 Hadamard" or "fp8 no-Hadamard": how it quantized; " outliers x50": what it was given */
    int k = snprintf(dtype, sizeof dtype, "%s", dtype_name(r->dtype));
    if (r->dtype == DT_FP8) k += snprintf(dtype + k, sizeof dtype - k, r->hadamard ? " Hadamard" : " no-Hadamard");
    if (r->outliers > 1) snprintf(dtype + k, sizeof dtype - k, " outliers x%g", r->outliers);
    if (r->max_err >= 0) snprintf(err, sizeof err, " max_err %.2e", r->max_err);
    else err[0] = 0;
    fprintf(f, "%-7s %s %s  %s %s | check %s%s%s%s%s | %.3f ms (min %.3f) | ",
            r->st->name, shape, r->sh.causal ? "causal" : "full",
            dtype, r->direction, r->check[0] == 'p' ? "PASS" : r->check[0] == 'f' ? "FAIL" : "skipped",
            err, r->checked[0] ? " (" : "", r->checked, r->checked[0] ? ")" : "", r->ms_median, r->ms_min);
    if (r->st->device == ON_GPU && r->splits > 0) /* split-KV: memory-bound, its bandwidth first */
        fprintf(f, "%.0f GB/s of K, V | %.2f TFLOP/s | %d split%s | extra %s | %s (%s)%s%s\n",
                kv_bytes(&r->sh, r->dtype) / (r->ms_median * 1e-3) / 1e9, tflops(r), r->splits,
                r->splits == 1 ? "" : "s", extra, r->device_name, r->arch, r->tiles[0] ? " | tiles " : "", r->tiles);
    else if (r->st->device == ON_GPU)
        fprintf(f, "%.1f TFLOP/s | extra %s | %s (%s)%s%s\n", tflops(r), extra, r->device_name, r->arch,
                r->tiles[0] ? " | tiles " : "", r->tiles);
    else
        fprintf(f, "%.2f GFLOP/s | extra %s | %d thread%s%s\n", tflops(r) * 1e3, extra, r->threads,
                r->threads == 1 ? "" : "s", built_with_openmp() ? "" : " (built without OpenMP)");
    fputs(r->ranks, f); /* a multi-rank stage: its lines, the whole and then each rank */
}

/* kv_len and kv_heads: the KV cache (seqlen and heads again for self-attention); splits: the
 * slices of the keys a split-KV stage used, empty for any other stage. */
void print_csv_header(FILE *f)
{
    fprintf(f, "stage,direction,gpu,dtype,batch,heads,seqlen,dim,causal,ms_median,ms_min,tflops,"
               "max_err,check,commit,extra_bytes,threads,kv_len,kv_heads,splits\n");
}

void print_csv_row(FILE *f, const struct result *r)
{
    char err[32] = "", splits[16] = "";
    if (r->max_err >= 0) snprintf(err, sizeof err, "%.3e", r->max_err);
    if (r->splits > 0) snprintf(splits, sizeof splits, "%d", r->splits);
    fprintf(f, "%s,%s,%s,%s,%d,%d,%d,%d,%d,%.4f,%.4f,%.3f,%s,%s,%s,%zu,%d,%d,%d,%s\n", r->st->name,
            r->direction, r->gpu, dtype_name(r->dtype), r->sh.B, r->sh.H, r->sh.N, r->sh.d,
            r->sh.causal, r->ms_median, r->ms_min, tflops(r), err, r->check, build_commit(),
            r->extra_bytes, r->threads, shape_kv_len(&r->sh), shape_kv_heads(&r->sh), splits);
}

void print_counters(FILE *f, const struct result *r)
{
    static const char *what[N_COUNTERS] = {
        [CNT_ROW_NORMALIZE] = "O row normalizations (an O row divided by l_i)",
        [CNT_ROW_CORRECT] = "O row corrections (an O row times e^(m_old - m_new))",
    };
    double rows = (double)shape_rows(&r->sh);
    fprintf(f, "  counted by the kernel (its counting build, run once more):\n");
    for (int c = 0; c < N_COUNTERS; c++)
        fprintf(f, "    %-54s %14llu  = %7.2f per row\n", what[c], r->counts[c], r->counts[c] / rows);
    if (!r->st->hbm_traffic) {
        fprintf(f, "  HBM bytes: %s gives no formula\n", r->st->name);
        return;
    }
    struct hbm_traffic t;
    r->st->hbm_traffic(&r->sh, &t);
    double total = t.Q + t.KV + t.O + t.O_work + t.rowstats;
    fprintf(f, "  HBM bytes its loop structure moves (the stage's formula): %.3f GB\n", total / 1e9);
    fprintf(f, "    Q %.3f GB (each row read %.2f times) | K, V %.3f GB | O %.3f GB | "
               "O workspace %.3f GB | m, l, L %.3f GB\n",
            t.Q / 1e9, t.q_reads, t.KV / 1e9, t.O / 1e9, t.O_work / 1e9, t.rowstats / 1e9);
}

/* --counters with --csv: the same counts and formula bytes as a CSV block of its own (header
 * printed by the caller), full precision, for scripts (bench/bench_ncu.sh) that must not parse
 * the lines above. Byte columns are empty for a stage without a formula. */
void print_counters_csv_header(FILE *f)
{
    fprintf(f, "stage,gpu,dtype,batch,heads,seqlen,dim,causal,row_normalizations,row_corrections,"
               "hbm_formula_bytes,hbm_q_bytes,hbm_kv_bytes,hbm_o_bytes,hbm_o_work_bytes,"
               "hbm_rowstats_bytes,q_reads,commit\n");
}

void print_counters_csv_row(FILE *f, const struct result *r)
{
    fprintf(f, "%s,%s,%s,%d,%d,%d,%d,%d,%llu,%llu,", r->st->name, r->gpu, dtype_name(r->dtype), r->sh.B,
            r->sh.H, r->sh.N, r->sh.d, r->sh.causal, r->counts[CNT_ROW_NORMALIZE], r->counts[CNT_ROW_CORRECT]);
    if (r->st->hbm_traffic) {
        struct hbm_traffic t;
        r->st->hbm_traffic(&r->sh, &t);
        fprintf(f, "%.0f,%.0f,%.0f,%.0f,%.0f,%.0f,%.4f,", t.Q + t.KV + t.O + t.O_work + t.rowstats, t.Q, t.KV,
                t.O, t.O_work, t.rowstats, t.q_reads);
    } else {
        fprintf(f, ",,,,,,,");
    }
    fprintf(f, "%s\n", build_commit());
}
