/* half.c: fp16, bf16 and FP8 e4m3 conversions on the host (round to nearest, ties to even). */
#include "half.h"
#include "attn.h"
#include <math.h>
#include <string.h>

static uint32_t bits_of(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
static float float_of(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

uint16_t f32_to_f16(float x)
{
    uint32_t u = bits_of(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* Inf stays Inf, NaN stays a quiet NaN */
        return sign | (absu > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (absu >= 0x477ff000u) /* rounds past 65504, the largest fp16 */
        return sign | 0x7c00u;
    if (absu < 0x38800000u) { /* below 2^-14: fp16 subnormal, in units of 2^-24 */
        float a = float_of(absu) * 16777216.0f; /* exact: scales by 2^24 */
        return sign | (uint16_t)lrintf(a);      /* lrintf rounds ties to even */
    }
    /* normal: rebias the exponent (127 -> 15), round the 23-bit mantissa to 10 bits */
    uint32_t mant_odd = (absu >> 13) & 1u;
    absu += 0xfffu + mant_odd;
    return sign | (uint16_t)((absu - 0x38000000u) >> 13);
}

float f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0) /* zero or subnormal: mant * 2^-24 */
        return float_of(sign | bits_of((float)mant * (1.0f / 16777216.0f)));
    if (exp == 31)
        return float_of(sign | 0x7f800000u | (mant << 13));
    return float_of(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t f32_to_bf16(float x)
{
    uint32_t u = bits_of(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u); /* keep NaN a NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float bf16_to_f32(uint16_t h) { return float_of((uint32_t)h << 16); }

uint8_t f32_to_e4m3(float x)
{
    if (isnan(x)) return 0x7f;
    const uint8_t sign = signbit(x) ? 0x80 : 0;
    const float a = fabsf(x);
    if (a >= E4M3_MAX) return sign | 0x7e; /* 448 and up, infinity included: saturate */
    if (a < 1.0f / 64) /* below 2^-6: a subnormal, in units of 2^-9 (8 of them make 2^-6, code 0x08) */
        return sign | (uint8_t)lrintf(a * 512.0f); /* exact scaling; lrintf rounds ties to even */
    int e2;
    const float f = frexpf(a, &e2);                 /* a = f 2^e2, f in [0.5, 1): a = 2f 2^(e2 - 1) */
    int e = e2 - 1, q = (int)lrintf((2.0f * f - 1.0f) * 8.0f); /* 3 mantissa bits, ties to even */
    if (q == 8) q = 0, e++;                         /* rounded up to the next power of 2 */
    if (e + 7 > 15 || (e + 7 == 15 && q == 7)) return sign | 0x7e; /* past 448 after rounding */
    return sign | (uint8_t)((e + 7) << 3 | q);
}

float e4m3_to_f32(uint8_t c)
{
    const float sign = c & 0x80 ? -1.0f : 1.0f;
    const int e = (c >> 3) & 15, m = c & 7;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) return sign * (float)m * (1.0f / 512);
    return sign * ldexpf(1.0f + (float)m / 8, e - 7);
}

float round_to_dtype(float x, int dtype)
{
    if (dtype == DT_F16) return f16_to_f32(f32_to_f16(x));
    if (dtype == DT_BF16) return bf16_to_f32(f32_to_bf16(x));
    return x;
}
