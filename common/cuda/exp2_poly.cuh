/* exp2_poly.cuh: 2^x on the FMA pipe, for the share of a softmax's exponentials that stage 18 takes
 * off the special-function unit (MUFU, 16 ex2 per clock and SM against 128 FFMA).
 *
 *   x = j + f, j = rint(x) (an integer), f in [-1/2, 1/2]
 *   2^f ~ p(f) = C0 + f (C1 + f (C2 + f C3))     three FFMA (Horner)
 *   2^x = p(f) 2^j: j added to p's exponent bits  one integer shift and add
 * rint by the "magic number" 1.5 2^23: adding it leaves x rounded to an integer in the low bits of
 * the sum (for |x| < 2^22), and subtracting it back gives j as a float: two FADD, no conversion
 * instruction (F2I and FRND run on a pipe as narrow as MUFU's). x below -125.5 gives 0 (2^-125.5
 * is 1.7e-38; ex2.approx.ftz flushes below 2^-126): there p(f) < 1 could take the exponent under
 * the normal range. -inf gives 0; x is at most a few units above 0 in the softmax (at most 8
 * under stage 17's stale max).
 *
 * The coefficients: a minimax fit of p(f) / 2^f - 1 on [-1/2, 1/2] (Lawson's iteration on 4001
 * Chebyshev points), rounded to float. Its largest relative error is 7.5e-5, 2^-13.7: under
 * half an ulp of fp16 (2^-11) and of bf16 (2^-8), the types P is rounded to before P V, so after
 * that rounding P differs from the hardware's by at most one ulp of the 16-bit type, in a few
 * cases. (Degree 4 would give 2.6e-6 for one more FFMA; the unit test prints the error.) */
#ifndef ATTN_CUDA_EXP2_POLY_CUH
#define ATTN_CUDA_EXP2_POLY_CUH

#include <string.h>

#define EXP2_POLY_C0 9.999280572e-01f
#define EXP2_POLY_C1 6.932609677e-01f
#define EXP2_POLY_C2 2.426111400e-01f
#define EXP2_POLY_C3 5.517162755e-02f
#define EXP2_POLY_MAGIC 12582912.f /* 1.5 * 2^23: x + MAGIC holds rint(x) in its low mantissa bits */
#define EXP2_POLY_MAGIC_BITS 0x4B400000 /* MAGIC's bits: the sum's bits minus these are rint(x) */

static __host__ __device__ __forceinline__ int exp2_poly_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_int(x);
#else
    int i;
    memcpy(&i, &x, sizeof i);
    return i;
#endif
}

static __host__ __device__ __forceinline__ float exp2_poly_float(int i)
{
#ifdef __CUDA_ARCH__
    return __int_as_float(i);
#else
    float x;
    memcpy(&x, &i, sizeof x);
    return x;
#endif
}

/* 2^x by three FFMA, two FADD and two integer operations (above); 0 for x < -125.5 and for -inf */
static __host__ __device__ __forceinline__ float exp2_poly(float x)
{
    const float xc = fmaxf(x, -127.f);             /* -inf and far below: a finite x, zeroed below */
    const float t = xc + EXP2_POLY_MAGIC;          /* rint(xc) in the low bits */
    const int j = exp2_poly_bits(t) - EXP2_POLY_MAGIC_BITS;
    const float f = xc - (t - EXP2_POLY_MAGIC);    /* in [-1/2, 1/2] */
    const float p = fmaf(fmaf(fmaf(EXP2_POLY_C3, f, EXP2_POLY_C2), f, EXP2_POLY_C1), f, EXP2_POLY_C0);
    const float r = exp2_poly_float(exp2_poly_bits(p) + (int)((unsigned)j << 23)); /* p 2^j: j into the exponent */
    return xc < -125.5f ? 0.f : r;
}

#endif
