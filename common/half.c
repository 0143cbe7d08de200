/* half.c: fp16 and bf16 conversions on the host (round to nearest, ties to even). */
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

float round_to_dtype(float x, int dtype)
{
    if (dtype == DT_F16) return f16_to_f32(f32_to_f16(x));
    if (dtype == DT_BF16) return bf16_to_f32(f32_to_bf16(x));
    return x;
}
