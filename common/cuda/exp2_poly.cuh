/* exp2_poly.cuh: 2^x on the FMA pipe, for the share of a softmax's exponentials that stage 18 takes
 * off the special-function unit (MUFU, 16 ex2 per clock and SM against 128 FFMA).
 *
 *   x = j + f, j = rint(x) (an integer), f in [-1/2, 1/2]
 *   2^f ~ p(f) = 1 + f (C1 + f (C2 + f (C3 + f (C4 + f C5))))     five FFMA (Horner)
 *   2^x = p(f) 2^j: j added to p's exponent bits                   one IMAD (below)
 * rint by the "magic number" 1.5 2^23: adding it leaves x rounded to an integer in the low bits of
 * the sum (for |x| < 2^22), and subtracting it back gives j as a float: with f, three FADD, and no
 * conversion instruction (F2I and FRND run on a pipe as narrow as MUFU's). In all, per exponential:
 * three FADD and five FFMA on the FMA pipe, one IMAD, one FSETP and one FSEL (x below -125.5 gives
 * 0: 2^-125.5 is 1.7e-38, and ex2.approx.ftz flushes below 2^-126; there p(f) 2^j could leave the
 * normal range). -inf gives 0 (f is NaN there, and the select discards it). Valid for x < 127.5;
 * the softmax's x is at most a few units above 0 (at most 8 under stage 17's stale max).
 *
 * The coefficients: Remez's minimax fit of p(f) / 2^f - 1 on [-1/2, 1/2] at degree 5 (7.5e-8 in
 * exact arithmetic), then C0 fixed at 1, so that p(0) = 1 exactly as the hardware's ex2(0) is, and
 * C1..C5 rounded to float and moved a few ulps by a coordinate search against the fp32 evaluation
 * below. Its largest relative error over every f on a grid of 2^-24, with the float rounding of
 * Horner's steps, is 1.87e-7 (2^-22.4): 3.1 units of fp32's unit roundoff (2^-24), 1.6 ulps of
 * fp32 at 1, of the order of the hardware's own error (the CUDA guide gives exp2f, built on MUFU's
 * ex2, 2 ulps). tests/test_exp2_poly.cu prints it.
 * Degree 3 (7.5e-5, three FFMA) and degree 4 (2.6e-6, four) are cheaper and invisible in a P rounded
 * to fp16 or bf16, but not in l_i, the fp32 sum of the P, and so in L = m + log l_i: the check's
 * allowance for L is 72 to a few hundred units of 2^-24 at the suite's shapes (common/check.c),
 * which degree 3 (1250 units; about 300 on a row spread evenly, with a quarter of its exponentials
 * on the polynomial) overran at d = 64 (notes/18_exp2_two_pipes.md). */
#ifndef ATTN_CUDA_EXP2_POLY_CUH
#define ATTN_CUDA_EXP2_POLY_CUH

#include <string.h>

#define EXP2_POLY_C1 0x1.62e428p-1f  /* 6.931469440e-01 (ln 2 = 6.931471806e-01) */
#define EXP2_POLY_C2 0x1.ebf924p-3f  /* 2.402212918e-01 */
#define EXP2_POLY_C3 0x1.c6b764p-5f  /* 5.550736934e-02 */
#define EXP2_POLY_C4 0x1.3d1cd2p-7f  /* 9.677507915e-03 */
#define EXP2_POLY_C5 0x1.5bc8e6p-10f /* 1.326693571e-03 */
#define EXP2_POLY_MAGIC 12582912.f /* 1.5 * 2^23: x + MAGIC holds rint(x) in its low mantissa bits */

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

/* 2^x by three FADD, five FFMA, an IMAD and a select (above); 0 for x < -125.5 and for -inf */
static __host__ __device__ __forceinline__ float exp2_poly(float x)
{
    const float t = x + EXP2_POLY_MAGIC;       /* rint(x) in the low bits */
    const float f = x - (t - EXP2_POLY_MAGIC); /* x - rint(x), in [-1/2, 1/2] */
    const float p = fmaf(fmaf(fmaf(fmaf(fmaf(EXP2_POLY_C5, f, EXP2_POLY_C4), f, EXP2_POLY_C3), f, EXP2_POLY_C2), f,
                              EXP2_POLY_C1),
                         f, 1.f);
    /* p 2^j: j into the exponent field. t's bits are MAGIC's plus j (two's complement, in the low
     * mantissa bits), and MAGIC's bits, 0x4B400000, end in nine zeros: shifted left by 23 they
     * vanish, so t's bits << 23 are j << 23; ptxas makes the shift and the add one instruction,
     * IMAD R, t, 0x800000, p (cuobjdump -sass) */
    const float r = exp2_poly_float((int)((unsigned)exp2_poly_bits(p) + ((unsigned)exp2_poly_bits(t) << 23)));
    return x < -125.5f ? 0.f : r;
}

#endif
