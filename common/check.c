/* check.c: comparing a stage's output with the reference, and the tolerance rule.
 *
 * The rule, per dtype (explained in notes/00_overview.md):
 *   |O - O_ref| <= vmax * (2 u_dt + u32 * (2 smax + 4 sqrt(N) + 16))
 *   |L - L_ref| <=         u32 * (2 smax + 4 sqrt(N) + 16)
 * where vmax = max|V|, smax = scale * d * max|Q| * max|K| bounds every score |S_ij|, u32 = 2^-24
 * is fp32's unit roundoff and u_dt that of the stage's dtype (0 for fp32, 2^-11 for fp16,
 * 2^-8 for bf16). Why each term:
 *   - 2 u_dt vmax: a reduced-precision stage rounds P to its dtype before P V (each P_ij off by
 *     at most u_dt relative, so O = sum P V / l is off by at most u_dt vmax) and rounds O itself
 *     (at most u_dt |O| <= u_dt vmax, since O is a convex combination of rows of V);
 *   - 2 u32 smax: a score computed in fp32 is off by about u32 |S| (the products are exact
 *     in fp32 for fp16 inputs; the sum rounds), which scales P_ij by exp(u32 |S|); smax is a
 *     bound, not a typical |S|, so 2 leaves room for two implementations rounding differently.
 *     With inputs scaled x50 this term dominates;
 *   - 4 sqrt(N) u32: the rounding of sums over N keys (l and P V) in fp32 (with a KV cache, the
 *     N_kv keys a row sums over);
 *   - 16 u32: exp, log and the division, a few ulps each.
 * NaN or Inf in the output fails, always.
 */
#include "harness.h"
#include <math.h>

#define U32 5.9604644775390625e-8 /* 2^-24, fp32 unit roundoff */

static double unit_roundoff(enum dtype dt)
{
    switch (dt) {
    case DT_F16: return 1.0 / 2048; /* 2^-11 */
    case DT_BF16: return 1.0 / 256; /* 2^-8 */
    default: return 0;              /* fp32 rounding is in the u32 terms */
    }
}

static double fp32_terms(const struct shape *sh, double qmax, double kmax)
{
    double smax = sh->scale * sh->d * qmax * kmax;
    return U32 * (2 * smax + 4 * sqrt((double)shape_kv_len(sh)) + 16);
}

double tol_output(const struct shape *sh, enum dtype dt, double qmax, double kmax, double vmax)
{
    return vmax * (2 * unit_roundoff(dt) + fp32_terms(sh, qmax, kmax));
}

double tol_lse(const struct shape *sh, enum dtype dt, double qmax, double kmax)
{
    (void)dt; /* L is accumulated in fp32 whatever the input dtype */
    return fp32_terms(sh, qmax, kmax);
}

double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t k = 0; k < n; k++)
        if (fabs(x[k]) > m) m = fabs(x[k]);
    return m;
}

struct cmp compare(const float *got, const double *want, size_t n, double tol)
{
    struct cmp c = {0};
    c.tol = tol;
    c.count = n;
    double sum = 0, worst = -1;
    for (size_t k = 0; k < n; k++) {
        if (!isfinite(got[k])) {
            if (!c.nonfinite++) c.worst = k; /* the first nonfinite element is the one shown */
            continue;
        }
        double e = fabs((double)got[k] - want[k]);
        sum += e;
        if (e > worst) {
            worst = e;
            if (!c.nonfinite) c.worst = k;
        }
    }
    c.max_err = worst > 0 ? worst : 0;
    c.mean_err = n ? sum / n : 0;
    c.got = n ? got[c.worst] : 0;
    c.want = n ? want[c.worst] : 0;
    c.pass = c.nonfinite == 0 && c.max_err <= tol;
    return c;
}

void cmp_merge(struct cmp *a, const struct cmp *b)
{
    int b_worse = (b->nonfinite && !a->nonfinite) ||
                  (!a->nonfinite && !b->nonfinite && b->max_err > a->max_err);
    if (b_worse) {
        a->worst = b->worst;
        a->got = b->got;
        a->want = b->want;
    }
    if (b->max_err > a->max_err) a->max_err = b->max_err;
    a->mean_err = (a->mean_err * a->count + b->mean_err * b->count) /
                  (double)((a->count + b->count) ? a->count + b->count : 1);
    a->count += b->count;
    a->nonfinite += b->nonfinite;
    if (b->tol > a->tol) a->tol = b->tol;
    a->pass = a->pass && b->pass;
}

void cmp_fold_nonfinite(struct cmp *c, const float *x, size_t n)
{
    struct cmp bad = {0}; /* bad.pass is 0 */
    for (size_t k = 0; k < n; k++)
        if (!isfinite(x[k]) && !bad.nonfinite++) bad.worst = k, bad.got = x[k], bad.want = NAN;
    if (bad.nonfinite) cmp_merge(c, &bad);
}

void cmp_print(FILE *f, const char *what, const struct cmp *c, const struct shape *sh, int is_rows)
{
    size_t w = c->worst;
    int cc = is_rows ? 0 : (int)(w % sh->d);
    size_t row = is_rows ? w : w / sh->d;
    int i = (int)(row % sh->N), h = (int)(row / sh->N % sh->H), b = (int)(row / sh->N / sh->H);
    fprintf(f, "%s: %s worst at [b=%d h=%d i=%d", what, c->pass ? "ok" : "FAIL", b, h, i);
    if (!is_rows) fprintf(f, " c=%d", cc);
    fprintf(f, "] got %.6g want %.6g | max_err %.3g mean_err %.3g tol %.3g nonfinite %zu of %zu\n",
            c->got, c->want, c->max_err, c->mean_err, c->tol, c->nonfinite, c->count);
}

/* Gradients (stage 10 against stage 1 or the fp64 oracle):
 *   |g - g_ref| <= gmax * (8 u_dt + u32 * (2 smax + 4 sqrt(N) + 16)) + floor
 * with gmax = max|g_ref| over the tensor. A reduced-precision backward rounds P and dS to its
 * dtype before the products dV = P^T dO, dK = dS^T Q and dQ = dS K: each term off by u_dt
 * relative, and these sums have terms of both signs, so the error is measured against the
 * gradient's largest magnitude with room for several roundings (P, dS = P (dP - D) with its
 * cancellation, the product) rather than one; the fp32 terms are the forward's.
 * The floor is for gradients that cancel to nothing: at N = 1, P = 1 and dS = dP - D = 0 exactly,
 * so dQ = dK = 0 and gmax = 0, while both sides still round dP and D (each at most
 * d max|dO| max|V|, passed as dov_max = max|dO| max|V|) in fp32: 16 roundings of that, times
 * scale max(|Q|, |K|). */
double tol_grad(const struct shape *sh, enum dtype dt, double qmax, double kmax, double dov_max, double gmax)
{
    double floor = 16 * U32 * sh->scale * fmax(qmax, kmax) * sh->d * dov_max;
    return gmax * (8 * unit_roundoff(dt) + fp32_terms(sh, qmax, kmax)) + floor;
}
