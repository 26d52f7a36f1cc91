/* exp for the host kernels: a polynomial on a reduced argument that the compiler vectorizes
 * (libm's expf is a call per element). Included by the kernels' .c files. */
#ifndef OMNI_EXP_APPROX_H
#define OMNI_EXP_APPROX_H

#include <stdint.h>
#include <string.h>

/* exp(x), clamped to |x| <= 88 (float's range); relative error about 1e-7. */
static inline float exp_approx(float x) {
    x = x < -87.f ? -87.f : (x > 88.f ? 88.f : x);
    const float k = __builtin_floorf(x * 1.44269504088896341f + 0.5f); /* x = k ln2 + r, |r| <= ln2 / 2 */
    const float r = x - k * 0.693359375f - k * -2.12194440e-4f;         /* ln2 in two parts */
    const float p = 1.f + r * (1.f + r * (0.5f + r * (1.f / 6 + r * (1.f / 24 + r * (1.f / 120 + r * (1.f / 720))))));
    const int32_t bits = ((int32_t)k + 127) << 23; /* 2^k */
    float two_k;
    memcpy(&two_k, &bits, sizeof two_k);
    return p * two_k;
}

#endif
