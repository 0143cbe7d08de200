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
 * FP8 (DT_FP8) has a rule of its own, against its arithmetic emulated (compare_fp8_head, below);
 * the fp16 rule above is its floor.
 */
#include "fp8.h"
#include "harness.h"
#include <float.h>
#include <math.h>
#include <stdlib.h>

#define U32 5.9604644775390625e-8 /* 2^-24, fp32 unit roundoff */

static double unit_roundoff(enum dtype dt)
{
    switch (dtype_io(dt)) { /* the dtype O is returned in: fp16 for fp8 (the rest of fp8's error: compare_fp8_head) */
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

/* Gradients (stage 10 against stage 1 or the fp64 oracle), row by row. Each element of a
 * gradient is a sum of terms:
 *   dQ_ic = scale sum_j dS_ij K_jc,   dK_jc = scale sum_i dS_ij Q_ic,   dV_jc = sum_i P_ij dO_ic,
 * with dS = P (dP - D), dP = dO V^T, D_i = rowsum(dO_i O_i). A backward in a 16-bit dtype rounds
 * P and dS to it before these products (stage 10 keeps them in 16-bit shared memory and
 * registers), takes D from the forward's 16-bit O, and returns the gradient in the dtype. Its
 * rounding errors are relative to the terms, not to their sum, and the two differ where the sum
 * cancels: every row of dS sums to 0 (sum_j P_ij dP_ij = D_i), so with every key equal
 * dQ = scale (sum_j dS_ij) K_0 = 0 exactly, while each term is as large as ever. So a row r of a
 * gradient (a query's row of dQ, a key's row of dK or dV) is allowed
 *   |g - g_ref| <= gscale_r * (8 u_dt + u32 * (2 smax + 4 sqrt(N) + 16)) + floor,
 *   gscale_r = max(max_c |g_ref_rc|, rss_r),
 * where rss_r is the root-sum-square of the terms an element of row r sums (grad_terms_head):
 *   - N terms each rounded (relative error up to u_dt, signs independent) add up to an error of
 *     about u_dt rss / sqrt(3), a random walk, not u_dt sum|terms|; where the roundings act
 *     together instead (an error in L_i scales row i of P, the result's own rounding), the error
 *     is relative to the result, up to u_dt max|g_ref|. The larger of the two covers either; 8
 *     leaves room for several roundings per term (P or dS, the product) and for the largest of
 *     a row's errors, a few deviations out. With stage 10's roundings emulated on the CPU
 *     (test_emulated_backward in tests/test_adversarial.c; d = 64, random and equal keys, causal
 *     or not, N from 2 to 1000 in fp16 and bf16, 4096 in fp16), the worst error of a row came to 1.7 u_dt gscale_r, a
 *     fifth of the allowance;
 *   - the fp32 terms are the forward's: a score off by u32 |S_ij| moves P_ij, and each term,
 *     by that much relatively; sums over N in fp32 round like sqrt(N) u32;
 *   - the floor covers the fp32 rounding of dP and D, which both sides do in their own order
 *     and which survives cancellation (at N = 1, P = 1 and dS = dP - D = 0 exactly, so
 *     dQ = dK = 0): each is at most d max|dO| max|V| (dov_max = max|dO| max|V|),
 *     16 roundings of that, times scale max(|Q|, |K|) (sum_j P_ij = 1 carries it into dQ).
 * rss_r is taken as max|other operand| times the norm of a row or column of dS or P:
 *   dQ_i: scale max|K| |dS_i.|,   dK_j: scale max|Q| |dS_.j|,   dV_j: max|dO| |P_.j|,
 * at most max|K| / rms|K| above each element's own (1.7 for uniform inputs). In fp16 each P_ij and
 * dS_ij counts as at least 2^-14, fp16's smallest normal: below it fp16 rounds to a multiple of
 * 2^-24, an error of up to 2^-25 = u_dt 2^-14 (P_ij ~ 1/N is there from N ~ 16k). D_i counts as terms
 * of its own: computed from the rounded O_i, it moves every dS_ij of row i by P_ij dD_i, which
 * adds up to dD_i over the row (sum_j P_ij = 1) where dS_ij's own roundings partly cancel; its
 * terms dO_ic O_ic join row i's sum for dQ_i and, times P_ij, column j's for dK_j.
 * Tight enough to fail a wrong gradient: one term of typical size dropped from a row's N is about
 * rss_r / sqrt(N), against an allowance of 8 u_dt rss_r (rss_r / 256 in fp16, / 32 in bf16), so
 * it fails up to N ~ 64k in fp16 and ~1k in bf16; past that it is smaller than the dtype's own
 * rounding noise. The maxima (Q, K, dO, V, smax) are the head's. */
double tol_grad(const struct shape *sh, enum dtype dt, double qmax, double kmax, double dov_max, double gscale)
{
    double floor = 16 * U32 * sh->scale * fmax(qmax, kmax) * sh->d * dov_max;
    return gscale * (8 * unit_roundoff(dt) + fp32_terms(sh, qmax, kmax)) + floor;
}

/* rss of head (b, h), from the fp64 forward of each row (P, O_i, D_i) and dS = P (dP - D): the
 * row norms of dS (with D_i's terms) for dQ, the column norms of dS (with P_ij times D_i's) for
 * dK and of P for dV, each value of P and dS taken as at least the magnitude whose rounding in dt
 * it has. O(N^2 d), as a backward; OpenMP over the rows. */
void grad_terms_head(const struct shape *sh, enum dtype dt, const float *Q, const float *K, const float *V,
                     const float *dO, int b, int h, double *rss)
{
    /* below 2^-14, fp16 rounds as if the value were 2^-14 (above) */
    const double tiny = dt == DT_F16 ? 1.0 / 16384 : 0;
    const int N = sh->N, d = sh->d;
    const size_t off = idx4(sh, b, h, 0, 0), nd = (size_t)N * d;
    const float *Qh = Q + off, *Kh = K + off, *Vh = V + off, *dOh = dO + off;
    const double qmax = max_abs(Qh, nd), kmax = max_abs(Kh, nd), gomax = max_abs(dOh, nd);
    double *rowQ = rss, *colK = rss + N, *colV = rss + 2 * (size_t)N;
    for (size_t k = 0; k < 3 * (size_t)N; k++) rss[k] = 0;
#pragma omp parallel
    {
        double *s = malloc(sizeof(double) * (size_t)N), *o = malloc(sizeof(double) * (size_t)d);
        double *cK = calloc((size_t)N, sizeof(double)), *cV = calloc((size_t)N, sizeof(double));
#pragma omp for schedule(dynamic, 16)
        for (int i = 0; i < N; i++) {
            const float *q = Qh + (size_t)i * d, *g = dOh + (size_t)i * d;
            const int kend = sh->causal ? i + 1 : N;
            double m = -INFINITY, l = 0, Di = 0, e = 0;
            for (int j = 0; j < kend; j++) { /* S_ij and the row max */
                const float *k = Kh + (size_t)j * d;
                double dot = 0;
                for (int c = 0; c < d; c++) dot += (double)q[c] * k[c];
                s[j] = dot * sh->scale;
                if (s[j] > m) m = s[j];
            }
            for (int c = 0; c < d; c++) o[c] = 0;
            for (int j = 0; j < kend; j++) { /* P_ij (not yet normalized) and O_i */
                s[j] = exp(s[j] - m);
                l += s[j];
                const float *v = Vh + (size_t)j * d;
                for (int c = 0; c < d; c++) o[c] += s[j] * v[c];
            }
            for (int c = 0; c < d; c++) { /* D_i and its terms, squared */
                const double t = g[c] * (o[c] / l);
                Di += t, e += t * t;
            }
            double sq = e;
            for (int j = 0; j < kend; j++) { /* dS_ij = P_ij (dP_ij - D_i) */
                const float *v = Vh + (size_t)j * d;
                double dP = 0;
                for (int c = 0; c < d; c++) dP += (double)g[c] * v[c];
                const double P = fmax(s[j] / l, tiny), dS = fmax(fabs(s[j] / l * (dP - Di)), tiny);
                sq += dS * dS, cK[j] += dS * dS + P * P * e, cV[j] += P * P;
            }
            rowQ[i] = sh->scale * kmax * sqrt(sq);
        }
#pragma omp critical
        for (int j = 0; j < N; j++) colK[j] += cK[j], colV[j] += cV[j];
        free(s), free(o), free(cK), free(cV);
    }
    for (int j = 0; j < N; j++) colK[j] = sh->scale * qmax * sqrt(colK[j]), colV[j] = gomax * sqrt(colV[j]);
}

/* got is past the allowance by this factor (above 1: fails); a finite error against no allowance
 * at all is DBL_MAX, so that only a nonfinite value (INFINITY) ranks above it */
static double excess(double err, double tol)
{
    return tol > 0 ? err / tol : err > 0 ? (isfinite(err) ? DBL_MAX : INFINITY) : 0;
}

/* For the checks whose allowance differs from value to value (a row's, an element's): start a
 * fold into c (a fresh one where first) and return how far its shown value is past its allowance
 * (infinitely, where that value is nonfinite). */
static double cmp_fold_begin(struct cmp *c, int first)
{
    if (first) *c = (struct cmp){.pass = 1};
    return first ? -1 : isfinite(c->got) ? excess(fabs(c->got - c->want), c->tol) : INFINITY;
}

/* Fold one compared value into c: at its index, got and want, err = |got - want| (INFINITY where
 * got is nonfinite, which the caller also counts in c->nonfinite), tol its own allowance. The value
 * shown is the first nonfinite one, else the one furthest past its allowance (*worst_x tracks how
 * far); max_err is the largest finite error. */
static void cmp_fold(struct cmp *c, double *worst_x, size_t at, double got, double want, double err, double tol)
{
    const double x = excess(err, tol);
    if (isfinite(err)) c->max_err = fmax(c->max_err, err);
    if (x > 1) c->pass = 0;
    if (x > *worst_x) *worst_x = x, c->worst = at, c->got = got, c->want = want, c->tol = tol;
}

void compare_grad_head(const struct shape *sh, enum dtype dt, const float *Q, const float *K, const float *V,
                       const float *dO, int b, int h, const float *const got[3], const double *const want[3],
                       int ref_fp32, struct cmp c[3], int first)
{
    const int N = sh->N, d = sh->d;
    const size_t off = idx4(sh, b, h, 0, 0), nd = (size_t)N * d;
    const double qmax = max_abs(Q + off, nd), kmax = max_abs(K + off, nd);
    const double dov = max_abs(dO + off, nd) * max_abs(V + off, nd);
    double *rss = malloc(sizeof(double) * 3 * (size_t)(N > 0 ? N : 1));
    grad_terms_head(sh, dt, Q, K, V, dO, b, h, rss);
    for (int t = 0; t < 3; t++) {
        struct cmp *a = &c[t];
        double worst_x = cmp_fold_begin(a, first), sum = a->mean_err * a->count;
        for (int r = 0; r < N; r++) {
            const float *g = got[t] + off + (size_t)r * d;
            const double *w = want[t] + (size_t)r * d;
            double gmax = 0;
            for (int k = 0; k < d; k++) gmax = fmax(gmax, fabs(w[k]));
            const double gscale = fmax(gmax, rss[t * (size_t)N + r]);
            const double tol = tol_grad(sh, dt, qmax, kmax, dov, gscale) +
                               (ref_fp32 ? tol_grad(sh, DT_F32, qmax, kmax, dov, gscale) : 0);
            for (int k = 0; k < d; k++) {
                const int bad = !isfinite(g[k]); /* counted and shown as nonfinite: got's, not want's */
                const double err = bad ? INFINITY : fabs((double)g[k] - w[k]);
                if (bad) a->nonfinite++;
                else sum += err;
                cmp_fold(a, &worst_x, off + (size_t)r * d + k, g[k], w[k], err, tol);
            }
        }
        a->count += nd;
        a->mean_err = a->count ? sum / a->count : 0;
    }
    free(rss);
}

/* ---- FP8 (DT_FP8): against the stage's own arithmetic, emulated ----
 * An FP8 stage's error is not a few units of roundoff: e4m3 keeps 3 mantissa bits, so each of
 * Q, K, V, P is off by up to 2^-4 of itself, and with outlier features the scores by a few per
 * cent of thousands; no bound in u_dt would be tight on one input and sound on the next. So the
 * rule is DESIGN.md's "twice the error of the computation done in the stage's precision, plus a
 * small floor", with that computation done: the FP8 stage's arithmetic emulated on the host
 * (fp8_forward_row in common/fp8.c: the same blocks of FP8_BLOCK_ROWS, the same Hadamard setting
 * and signs, P into P V as e4m3(256 P sV / SV)), both against the fp64 oracle on the same fp16 inputs:
 *   row i of O:  max_c |O_ic - O_ref_ic| <= 2 max_c |O_emu_ic - O_ref_ic| + tol_output(fp16)
 *   L_i:         |L_i - L_ref_i|          <= 2 |L_emu_i - L_ref_i|         + tol_lse(fp16)
 * Why per row and by the row's largest error, not per element: the stage and the emulation round
 * the same values to e4m3 the same way, but not all of them: a kernel's P_ij is taken against the
 * running max of the keys it has seen (the emulation's against the row's), and its fp32 sums run
 * in another order, so a value near a tie of e4m3 can round up on one side and down on the other
 * (a whole e4m3 step, 2^-3 of it). Those are errors of the same size but not the same errors, and
 * element by element one side's can be near zero where the other's is not. Over a row's d elements
 * the largest of either is a steady figure (each moves every element of the row: a P_ij all of
 * O_i's, a score all the row's P), so twice it holds a correct stage with room, and still fails an
 * element gone wrong by more than twice what FP8 itself costs the row. The floor is the fp16
 * stages' own allowance: the stage returns O rounded to fp16 (the emulation keeps fp64), and sums
 * in fp32 in its own order. L is one value a row, its error that of the row's scores (the same
 * quantized values on both sides), so it is judged alone. One term more on both: the tensor cores
 * keep about 13 bits at each k32 step of a score, as the emulation does, but not exactly the same
 * bits, so a row's scores may part by a few units of the 13th bit of the sum of |q_c k_jc| on
 * each step (a, which fp8_forward_row returns): L_i's allowance takes a, O_i's 2 a max|V|. Without it, a
 * row whose emulated L happened to land within a hair of the oracle's failed a correct stage (on
 * the H200, outlier inputs: 0.04 apart at L = 190, where a is about 0.2). With a kernel's way simulated on the host
 * (the running max over tiles of 128 keys, P rounded as e4m3(256 P sv / max sv) as stage 19 folds
 * V's scale into P, fp32 accumulators, every transformed value of Q and K nudged by an fp32 ulp
 * before quantizing; d 64 and 128, N 1000 and 2048, causal or not, outliers x1 and x50, the
 * transform on and off, two seeds, every row of two heads) the worst row of O came to 0.87 of its
 * allowance and the worst L to 0.75. NaN or Inf fails, always. */
void compare_fp8_head(const struct shape *sh, int hadamard, const float *Q, const float *K, const float *V,
                      const float *O, const float *L, int b, int h, const int *rows, int nrows, double floor_O,
                      double floor_L, struct cmp *cO, struct cmp *cL, int first)
{
    const int d = sh->d;
    struct fp8_head hd;
    fp8_head_quantize(&hd, sh, Q, K, V, b, h, FP8_BLOCK_ROWS, hadamard);
    double vmax = 0; /* the largest dequantized |V| of the head */
    for (int j = 0; j < shape_kv_len(sh); j++)
        for (int c = 0; c < d; c++) vmax = fmax(vmax, fabs((double)hd.sv[j / hd.block] * hd.v[(size_t)j * d + c]));
    /* each checked row as one comparison, for O and for L (t = 0, 1): its worst element (a
     * nonfinite one first), that element's reference, the row's allowance, the sum of its errors
     * and its count of nonfinite elements */
    struct fp8_row { size_t at; double err, want, tol, sum; size_t nonfinite; } *row = malloc(sizeof *row * 2 * (size_t)(nrows > 0 ? nrows : 1));
#pragma omp parallel
    {
        double *o_ref = malloc(sizeof(double) * 2 * (size_t)d), *o_emu = o_ref + d;
        float *S = malloc(sizeof(float) * (size_t)shape_kv_len(sh));
#pragma omp for schedule(dynamic, 4)
        for (int r = 0; r < nrows; r++) {
            const int i = rows[r];
            double lse_ref, lse_emu, e_emu = 0;
            oracle_forward_row(sh, Q, K, V, b, h, i, o_ref, &lse_ref);
            double a; /* how far the hardware's scores may part from the emulation's (fp8_forward_row) */
            fp8_forward_row(&hd, i, keys_seen(sh, i), sh->scale, S, o_emu, &lse_emu, &a);
            struct fp8_row *ro = &row[2 * r], *rl = &row[2 * r + 1];
            *ro = (struct fp8_row){.err = -1};
            for (int c = 0; c < d; c++) {
                e_emu = fmax(e_emu, fabs(o_emu[c] - o_ref[c]));
                const size_t at = idx4(sh, b, h, i, c);
                /* a nonfinite element is the row's worst: infinitely far past any allowance */
                const double e = isfinite(O[at]) ? fabs((double)O[at] - o_ref[c]) : INFINITY;
                if (isfinite(e)) ro->sum += e;
                else ro->nonfinite++;
                if (e > ro->err) ro->err = e, ro->at = at, ro->want = o_ref[c];
            }
            /* the hardware's scores may part from the emulation's by up to a: L by a, each weight
             * of O by a factor e^(+-a), so O by 2 a max|V| */
            ro->tol = 2 * e_emu + floor_O + 2 * a * vmax;
            const size_t at = idx3(sh, b, h, i);
            const double e = isfinite(L[at]) ? fabs((double)L[at] - lse_ref) : INFINITY;
            *rl = (struct fp8_row){.at = at, .err = e, .want = lse_ref, .tol = 2 * fabs(lse_emu - lse_ref) + floor_L + a,
                                   .sum = isfinite(e) ? e : 0, .nonfinite = !isfinite(e)};
        }
        free(o_ref), free(S);
    }
    /* fold the rows into cO and cL: the worst element shown is the one furthest past its row's
     * allowance, tol that allowance; max_err the largest finite error */
    for (int t = 0; t < 2; t++) {
        struct cmp *a = t ? cL : cO;
        const float *got = t ? L : O;
        double worst_x = cmp_fold_begin(a, first), sum = a->mean_err * a->count;
        for (int r = 0; r < nrows; r++) {
            const struct fp8_row *w = &row[2 * r + t];
            sum += w->sum, a->nonfinite += w->nonfinite;
            cmp_fold(a, &worst_x, w->at, got[w->at], w->want, w->err, w->tol);
        }
        a->count += (size_t)nrows * (t ? 1 : (size_t)d);
        a->mean_err = a->count ? sum / a->count : 0;
    }
    free(row);
    fp8_head_free(&hd);
}
