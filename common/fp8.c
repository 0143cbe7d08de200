/* fp8.c: the random-sign Hadamard transform and outlier inputs (fp8.h). */
#include "fp8.h"
#include "half.h"
#include "harness.h"
#include <math.h>

void hadamard_signs(int8_t *signs, int d, uint64_t seed)
{
    uint64_t z = seed * 0x9e3779b97f4a7c15ull + 0x632be59bd9b4e019ull;
    for (int k = 0; k < d; k++) { /* one splitmix64 step a sign */
        z += 0x9e3779b97f4a7c15ull;
        uint64_t r = z;
        r = (r ^ (r >> 30)) * 0xbf58476d1ce4e5b9ull;
        r = (r ^ (r >> 27)) * 0x94d049bb133111ebull;
        r ^= r >> 31;
        signs[k] = (r >> 63) ? -1 : 1;
    }
}

void hadamard_rows(float *x, size_t rows, int d, const int8_t *signs)
{
    const float norm = 1.0f / sqrtf((float)d);
    for (size_t r = 0; r < rows; r++) {
        float *v = x + r * d;
        for (int k = 0; k < d; k++) v[k] *= signs[k];
        /* H_{2h} = [[H_h, H_h], [H_h, -H_h]]: butterflies of stride h = 1, 2, 4, ... */
        for (int h = 1; h < d; h *= 2)
            for (int i = 0; i < d; i += 2 * h)
                for (int k = i; k < i + h; k++) {
                    const float a = v[k], b = v[k + h];
                    v[k] = a + b, v[k + h] = a - b;
                }
        for (int k = 0; k < d; k++) v[k] *= norm;
    }
}

int outlier_channel(int k, int d)
{
    return (k * d) / OUTLIER_CHANNELS + d / (2 * OUTLIER_CHANNELS) + k; /* 4 channels, apart, not aligned */
}

void add_outliers(const struct shape *sh, float factor, enum dtype dt, float *Q, float *K)
{
    const int d = sh->d;
    const size_t rows[2] = {shape_rows(sh), shape_kv_elems(sh) / d}; /* K: [B, H_kv, N_kv, d] */
    float *x[2] = {Q, K};
    for (int t = 0; t < 2; t++)
        for (size_t r = 0; r < rows[t]; r++)
            for (int k = 0; k < OUTLIER_CHANNELS && k < d; k++) {
                float *v = &x[t][r * d + outlier_channel(k, d) % d];
                *v = round_to_dtype(round_to_dtype(*v * factor, DT_F16), dt);
            }
}
