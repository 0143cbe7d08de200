/* attn.c: the small shared pieces of the stage contract (FLOP count, dtype names, support). */
#include "attn.h"
#include <stdio.h>
#include <string.h>

double attn_flops(const struct shape *sh, int backward)
{
    const double N = sh->N, pairs = N * shape_kv_len(sh) - (sh->causal ? N * N / 2 : 0);
    const double f = 4.0 * sh->B * sh->H * pairs * sh->d;
    return backward ? 2.5 * f : f;
}

const char *dtype_name(enum dtype dt)
{
    switch (dt) {
    case DT_F32: return "fp32";
    case DT_F16: return "fp16";
    case DT_BF16: return "bf16";
    case DT_FP8: return "fp8";
    }
    return "?";
}

enum dtype dtype_io(enum dtype dt) { return dt == DT_FP8 ? DT_F16 : dt; }

size_t dtype_size(enum dtype dt) { return dtype_io(dt) == DT_F32 ? 4 : 2; }

int stage_supports(const struct stage *st, const struct shape *sh, enum dtype dt, char *why, size_t n)
{
    const int N_kv = shape_kv_len(sh), H_kv = shape_kv_heads(sh);
    if (sh->H % H_kv) {
        snprintf(why, n, "%s: %d heads do not share %d KV heads evenly (--heads must be a multiple of --kv-heads)",
                 st->name, sh->H, H_kv);
        return 0;
    }
    if (sh->causal && N_kv < sh->N) {
        snprintf(why, n, "%s: causal with %d keys for %d queries: the queries are the last N of the N_kv positions, "
                         "so --kv-len must be at least --seqlen", st->name, N_kv, sh->N);
        return 0;
    }
    if (!st->kv_cache && !shape_is_self(sh)) {
        snprintf(why, n, "%s takes self-attention only: --kv-len must equal --seqlen and --kv-heads --heads (got %d "
                         "keys in %d heads for %d queries in %d heads)", st->name, N_kv, H_kv, sh->N, sh->H);
        return 0;
    }
    if (st->max_seqlen && sh->N > st->max_seqlen) {
        snprintf(why, n, "%s takes at most %d queries per head (--seqlen 1 to %d; got %d): it is written for "
                         "generation, a few queries against a long KV cache (--kv-len)", st->name, st->max_seqlen,
                 st->max_seqlen, sh->N);
        return 0;
    }
    if (dt == DT_FP8 && st->measures_backward) {
        snprintf(why, n, "%s measures its backward; fp8 is a forward only (--dtype fp16 or bf16)", st->name);
        return 0;
    }
    if (!(st->dtypes & dt)) {
        int k = snprintf(why, n, "%s does not support dtype %s; it supports:", st->name, dtype_name(dt));
        for (unsigned bit = DT_F32; bit <= DT_LAST; bit <<= 1)
            if ((st->dtypes & bit) && k > 0 && (size_t)k < n)
                k += snprintf(why + k, n - k, " %s", dtype_name((enum dtype)bit));
        return 0;
    }
    if (st->dims[0] == 0) return 1;
    for (int k = 0; k < 8 && st->dims[k]; k++)
        if (st->dims[k] == sh->d) return 1;
    int k = snprintf(why, n, "%s does not support head dim %d; it supports:", st->name, sh->d);
    for (int j = 0; j < 8 && st->dims[j] && k > 0 && (size_t)k < n; j++)
        k += snprintf(why + k, n - k, " %d", st->dims[j]);
    return 0;
}

int stage_failed(const struct stage *st, int rc, char *why, size_t n)
{
    char reason[512];
    snprintf(reason, sizeof reason, "%s", why);
    snprintf(why, n, "%s: %s", st->name, reason);
    return rc == ATTN_CUDA_ERROR ? 4 /* EXIT_CUDA_ERROR */ : 2 /* EXIT_USAGE */;
}
