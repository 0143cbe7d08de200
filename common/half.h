/* half.h: fp16 and bf16 on the host, as raw 16-bit patterns (round to nearest even). */
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
/* Round x to the nearest value of dtype (2 = fp16, 4 = bf16, anything else: unchanged). */
float round_to_dtype(float x, int dtype);
#ifdef __cplusplus
}
#endif
#endif
