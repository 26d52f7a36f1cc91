/* Sixteen-float vectors for the host kernels, as GCC / Clang generic vectors (lowered to the
 * target's registers: one AVX-512 register, two AVX2 or four NEON ones). Included by the kernels'
 * .c files. */
#ifndef OMNI_VEC16_H
#define OMNI_VEC16_H

#include <stdint.h>
#include <string.h>

typedef float v16 __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64))); /* lane masks of comparisons: -1 or 0 */

static inline __attribute__((always_inline)) v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline __attribute__((always_inline)) void store16(float *p, v16 v) { memcpy(p, &v, sizeof v); }

/* Lane-wise a if a > b, else b. */
static inline __attribute__((always_inline)) v16 max16(v16 a, v16 b) {
    const v16i a_larger = a > b;
    return (v16)((a_larger & (v16i)a) | (~a_larger & (v16i)b));
}

#endif
