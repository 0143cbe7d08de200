/* test_fp8.c: the host's FP8 e4m3 conversions (half.c) and the random-sign Hadamard transform
 * and outlier inputs of the FP8 stage (fp8.c).
 *
 * fp8::e4m3_every_code   every pattern but the two NaNs decodes to a value that encodes back to
 *                        it, and the finite values rise with the code (0x00 .. 0x7e)
 * fp8::e4m3_rounding     ties to even (normal and subnormal), saturation to 448 (infinity too),
 *                        the smallest subnormal, NaN
 * fp8::hadamard          the transform keeps dot products and lengths (it is orthogonal), and
 *                        spreads one large channel over all d: 50 in one channel becomes 50/sqrt(d)
 *                        in every channel
 * fp8::outliers          add_outliers scales exactly its channels of Q and K, in every row
 */
#include "common_test.h"
#include "common/fp8.h"
#include "common/half.h"
#include <math.h>
#include <stdlib.h>

Test(fp8, e4m3_every_code)
{
    float prev = -1.0f;
    for (int c = 0; c < 256; c++) {
        const float x = e4m3_to_f32((uint8_t)c);
        if ((c & 0x7f) == 0x7f) {
            cr_assert(isnan(x), "0x%02x decodes to %g, want NaN", c, x);
            continue;
        }
        cr_assert(f32_to_e4m3(x) == c, "0x%02x decodes to %g, which encodes to 0x%02x", c, x, f32_to_e4m3(x));
        if (c <= 0x7e) {
            cr_assert(c == 0 || x > prev, "0x%02x (%g) is not above 0x%02x (%g)", c, x, c - 1, prev);
            prev = x;
        }
    }
    cr_assert(e4m3_to_f32(0x7e) == 448.0f && e4m3_to_f32(0x01) == 1.0f / 512 && e4m3_to_f32(0x08) == 1.0f / 64,
              "the largest (448), the smallest subnormal (2^-9) and the smallest normal (2^-6)");
}

Test(fp8, e4m3_rounding)
{
    static const struct {
        float x;
        uint8_t want;
        const char *why;
    } cases[] = {
        {1.0f + 1.0f / 16, 0x38, "halfway between 1 and 1.125: to 1 (even mantissa 0)"},
        {1.0f + 3.0f / 16, 0x3a, "halfway between 1.125 and 1.25: to 1.25 (even mantissa 2)"},
        {1.0f + 1.0f / 16 + 1e-3f, 0x39, "just past halfway: up"},
        {0.5f / 512, 0x00, "half the smallest subnormal: to 0 (even)"},
        {1.5f / 512, 0x02, "halfway between 1 and 2 units of 2^-9: to 2 (even)"},
        {7.5f / 512, 0x08, "halfway between the largest subnormal and 2^-6: to 2^-6 (even)"},
        {464.0f, 0x7e, "halfway past 448 (to 480, which e4m3 lacks): saturates"},
        {1e30f, 0x7e, "far past 448: saturates"},
        {INFINITY, 0x7e, "infinity: saturates"},
        {-INFINITY, 0xfe, "minus infinity: saturates to -448"},
        {-3.0f, 0xc4, "-3 = -1.5 x 2^1"},
        {-0.0f, 0x80, "minus zero"},
        {NAN, 0x7f, "NaN"},
    };
    for (size_t k = 0; k < TEST_COUNT(cases); k++)
        cr_expect(f32_to_e4m3(cases[k].x) == cases[k].want, "%s: %g encodes to 0x%02x, want 0x%02x", cases[k].why,
                  cases[k].x, f32_to_e4m3(cases[k].x), cases[k].want);
}

Test(fp8, hadamard)
{
    for (int d = 64; d <= 256; d *= 2) {
        int8_t *s = malloc(d);
        float *q = malloc(2 * d * sizeof(float)), *k = q + d;
        hadamard_signs(s, d, 7);
        int minus = 0;
        for (int c = 0; c < d; c++) minus += s[c] < 0;
        cr_assert(minus > d / 4 && minus < 3 * d / 4, "d=%d: %d of the signs are -1", d, minus);
        fill_uniform(q, 2 * d, 11, 1.0f, DT_F32);
        double dot = 0, qq = 0;
        for (int c = 0; c < d; c++) dot += (double)q[c] * k[c], qq += (double)q[c] * q[c];
        hadamard_rows(q, 2, d, s);
        double dot_h = 0, qq_h = 0;
        for (int c = 0; c < d; c++) dot_h += (double)q[c] * k[c], qq_h += (double)q[c] * q[c];
        cr_expect(fabs(dot_h - dot) < 1e-5 * sqrt(qq * d), "d=%d: q.k %g becomes %g", d, dot, dot_h);
        cr_expect(fabs(qq_h - qq) < 1e-5 * qq, "d=%d: |q|^2 %g becomes %g", d, qq, qq_h);
        /* one outlier channel spread evenly over all d */
        for (int c = 0; c < d; c++) q[c] = c == 5 ? 50.0f : 0.0f;
        hadamard_rows(q, 1, d, s);
        for (int c = 0; c < d; c++)
            cr_assert(fabsf(fabsf(q[c]) - 50.0f / sqrtf((float)d)) < 1e-4f, "d=%d: channel %d is %g, want +-%g", d, c,
                      q[c], 50.0f / sqrtf((float)d));
        free(s), free(q);
    }
}

Test(fp8, outliers)
{
    const struct shape sh = test_shape(1, 2, 3, 64, 0);
    const size_t n = shape_elems(&sh);
    float *Q = malloc(4 * n * sizeof(float)), *K = Q + n, *Q0 = K + n, *K0 = Q0 + n;
    fill_uniform(Q, n, 1, 1.0f, DT_F16), fill_uniform(K, n, 2, 1.0f, DT_F16);
    for (size_t e = 0; e < n; e++) Q0[e] = Q[e], K0[e] = K[e];
    add_outliers(&sh, 50.0f, DT_F16, Q, K);
    for (size_t e = 0; e < n; e++) {
        int c = (int)(e % 64), is_outlier = 0;
        for (int k = 0; k < OUTLIER_CHANNELS; k++) is_outlier |= outlier_channel(k, 64) == c;
        const float wq = is_outlier ? round_to_dtype(Q0[e] * 50.0f, DT_F16) : Q0[e];
        const float wk = is_outlier ? round_to_dtype(K0[e] * 50.0f, DT_F16) : K0[e];
        cr_assert(Q[e] == wq && K[e] == wk, "element %zu (channel %d): Q %g, K %g, want %g, %g", e, c, Q[e], K[e], wq, wk);
    }
    free(Q);
}
