/* half.h: fp16 and bf16 on the host, as raw 16-bit patterns (round to nearest even); FP8 e4m3 as
 * raw 8-bit patterns. */
#ifndef HALF_H
#define HALF_H
#include <stdint.h>
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
/* FP8 e4m3 (Hopper's wgmma takes it, FP8 stage 19): 1 sign bit, 4 exponent bits (bias 7), 3
 * mantissa bits; no infinities, one NaN pattern per sign (exponent and mantissa all ones). Normal
 * values 2^-6 .. 448 (1.75 x 2^8), subnormals m x 2^-9 (m = 1 .. 7). f32_to_e4m3 rounds to the
 * nearest, ties to even, and saturates to +-448 what is larger (infinity too), as the GPU's
 * cvt.rn.satfinite.e4m3x2.f32 does; NaN -> 0x7f. */
uint8_t f32_to_e4m3(float x);
float e4m3_to_f32(uint8_t c);
#define E4M3_MAX 448.0f
/* Round x to the nearest value of dtype (2 = fp16, 4 = bf16, anything else: unchanged). */
float round_to_dtype(float x, int dtype);
#ifdef __cplusplus
}
#endif
#endif
