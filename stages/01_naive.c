/* 01_naive.c: attention exactly as the formula reads, on the CPU in fp32.
 *
 *   S = scale * Q K^T      (N x N per head, materialized)
 *   P = softmax(S) by rows (the row max subtracted first, so exp never overflows)
 *   O = P V,  L = m + log(sum_j exp(S_ij - m))  (the row logsumexp the backward needs)
 *
 * Every check runs this file: it is the reference every other stage must match (and it answers
 * itself to the fp64 oracle in common/oracle.c). Its cost is the N x N score matrix: 4 N^2 bytes
 * per head (64 MiB at N = 4096), which is what every later stage avoids.
 * With a KV cache (--kv-len, --kv-heads: stage 15's reference) S is N x N_kv, head h reads KV head
 * h / (H / H_kv), and causal query i sees the keys up to its position N_kv - N + i (keys_seen).
 * Also the naive backward (dQ, dK, dV from dO), the reference for stage 10 (self-attention only).
 * Run: ./stage1 --seqlen 1024 --dim 64 --causal
 */
#include "common/attn.h"
#include "common/mem.h"
#include <math.h>
#include <stdio.h>

/* ---- forward ---- */

/* S_i = scale * q_i K^T for one row, with the keys query i does not see (causal: after its
 * position) masked to -inf. */
static void scores_row(const struct shape *sh, const float *q, const float *K, int i, float *S_i)
{
    const int seen = keys_seen(sh, i);
    for (int j = 0; j < shape_kv_len(sh); j++) {
        if (j >= seen) { S_i[j] = -INFINITY; continue; }
        const float *k = K + (size_t)j * sh->d;
        float dot = 0;
        for (int c = 0; c < sh->d; c++) dot += q[c] * k[c];
        S_i[j] = dot * sh->scale;
    }
}

static int forward(const struct attn_args *a, char *why, size_t n)
{
    (void)why, (void)n;
    const struct shape *sh = &a->sh;
    int N = sh->N, N_kv = shape_kv_len(sh), d = sh->d;
    float *S = mem_alloc(sizeof(float) * (size_t)N * N_kv); /* the N x N_kv matrix: this stage's lesson */
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++) {
            const float *Q = (const float *)a->Q + idx4(sh, b, h, 0, 0);
            const float *K = (const float *)a->K + idx4_kv(sh, b, kv_head_of(sh, h), 0, 0);
            const float *V = (const float *)a->V + idx4_kv(sh, b, kv_head_of(sh, h), 0, 0);
            float *O = (float *)a->O + idx4(sh, b, h, 0, 0);
            float *L = a->L + idx3(sh, b, h, 0);
            /* S = scale * Q K^T */
            for (int i = 0; i < N; i++) scores_row(sh, Q + (size_t)i * d, K, i, S + (size_t)i * N_kv);
            /* P = softmax(S), row by row, in place */
            for (int i = 0; i < N; i++) {
                float *S_i = S + (size_t)i * N_kv;
                float m_i = -INFINITY; /* m_i = max_j S_ij */
                for (int j = 0; j < N_kv; j++) m_i = fmaxf(m_i, S_i[j]);
                float l_i = 0; /* l_i = sum_j exp(S_ij - m_i) */
                for (int j = 0; j < N_kv; j++) {
                    S_i[j] = expf(S_i[j] - m_i);
                    l_i += S_i[j];
                }
                for (int j = 0; j < N_kv; j++) S_i[j] /= l_i;
                L[i] = m_i + logf(l_i);
            }
            /* O = P V */
            for (int i = 0; i < N; i++) {
                float *O_i = O + (size_t)i * d;
                for (int c = 0; c < d; c++) O_i[c] = 0;
                for (int j = 0; j < N_kv; j++) {
                    float p = S[(size_t)i * N_kv + j];
                    for (int c = 0; c < d; c++) O_i[c] += p * V[(size_t)j * d + c];
                }
            }
        }
    mem_free(S);
    return 0;
}

/* ---- backward ---- */
/* With the forward's L: P = exp(S - L), and for the loss sum(dO * O):
 *   dV = P^T dO,  dP = dO V^T,  D_i = rowsum(dO_i * O_i),  dS = P * (dP - D),
 *   dQ = scale dS K,  dK = scale dS^T Q.
 * Naive: P and dS are materialized, N x N each. */
static int backward(const struct attn_args *a, char *why, size_t n)
{
    const struct shape *sh = &a->sh;
    if (!shape_is_self(sh)) { /* no backward stage takes a KV cache, so nothing needs this one's */
        snprintf(why, n, "the naive backward takes self-attention only (N_kv = N, H_kv = H)");
        return ATTN_UNSUPPORTED;
    }
    int N = sh->N, d = sh->d;
    float *P = mem_alloc(sizeof(float) * (size_t)N * N);
    float *dS = mem_alloc(sizeof(float) * (size_t)N * N);
    for (int b = 0; b < sh->B; b++)
        for (int h = 0; h < sh->H; h++) {
            size_t off = idx4(sh, b, h, 0, 0);
            const float *Q = (const float *)a->Q + off, *K = (const float *)a->K + off;
            const float *V = (const float *)a->V + off, *O = (const float *)a->O + off;
            const float *dO = (const float *)a->dO + off, *L = a->L + idx3(sh, b, h, 0);
            float *dQ = (float *)a->dQ + off, *dK = (float *)a->dK + off, *dV = (float *)a->dV + off;
            for (int i = 0; i < N; i++) { /* P = exp(S - L) */
                float *P_i = P + (size_t)i * N;
                scores_row(sh, Q + (size_t)i * d, K, i, P_i);
                for (int j = 0; j < N; j++) P_i[j] = expf(P_i[j] - L[i]);
            }
            for (int i = 0; i < N; i++) { /* dS = P * (dO V^T - D) */
                const float *dO_i = dO + (size_t)i * d, *O_i = O + (size_t)i * d;
                float D_i = 0;
                for (int c = 0; c < d; c++) D_i += dO_i[c] * O_i[c];
                for (int j = 0; j < N; j++) {
                    float dP_ij = 0;
                    for (int c = 0; c < d; c++) dP_ij += dO_i[c] * V[(size_t)j * d + c];
                    dS[(size_t)i * N + j] = P[(size_t)i * N + j] * (dP_ij - D_i);
                }
            }
            for (int i = 0; i < N; i++) /* dQ = scale dS K */
                for (int c = 0; c < d; c++) {
                    float acc = 0;
                    for (int j = 0; j < N; j++) acc += dS[(size_t)i * N + j] * K[(size_t)j * d + c];
                    dQ[(size_t)i * d + c] = sh->scale * acc;
                }
            for (int j = 0; j < N; j++) /* dK = scale dS^T Q,  dV = P^T dO */
                for (int c = 0; c < d; c++) {
                    float acc_k = 0, acc_v = 0;
                    for (int i = 0; i < N; i++) {
                        acc_k += dS[(size_t)i * N + j] * Q[(size_t)i * d + c];
                        acc_v += P[(size_t)i * N + j] * dO[(size_t)i * d + c];
                    }
                    dK[(size_t)j * d + c] = sh->scale * acc_k;
                    dV[(size_t)j * d + c] = acc_v;
                }
        }
    mem_free(P);
    mem_free(dS);
    return 0;
}

/* ---- descriptor ---- */
/* The host scratch its program's forward allocates: the N x N_kv scores (the backward, used as a
 * reference for small problems only, takes two N x N matrices). */
static size_t scratch_bytes(const struct attn_args *a)
{
    return sizeof(float) * (size_t)a->sh.N * shape_kv_len(&a->sh);
}

const struct stage stage1_desc = {
    .name = "stage1",
    .idea = "naive: S = scale QK^T materialized, row softmax, O = PV",
    .device = ON_CPU,
    .forward = forward,
    .backward = backward,
    .dims = {0}, /* any head dim */
    .dtypes = DT_F32,
    .workspace_bytes = scratch_bytes,
    .kv_cache = 1, /* the reference of stage 15 too */
};
