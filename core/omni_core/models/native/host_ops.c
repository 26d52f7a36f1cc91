/* Fused element-wise steps of a decoder layer on the host, float32: each is one pass over its
 * rows where torch runs several ops (and several passes) at the shapes of a decode step.
 *
 *   add_rms_norm:   (residual +) x -> weight * normalised; the sum kept as the new residual
 *   silu_mul:       [rows, 2 * inter] gate|up -> silu(gate) * up
 *   rotary_store:   NeoX rotary on q and k rows, k and v written into the paged cache at slots
 *   argmax_rows:    each row's first largest value's index (greedy sampling)
 *
 * Row strides are given in floats, so q/k/v may be column slices of one projection output.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "exp_approx.h"
#include "vec16.h"

void add_rms_norm_f32(const float *x, const float *residual, const float *weight, float eps, int64_t rows, int64_t hidden,
                      float *out, float *residual_out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * hidden;
        float *sum_row = residual ? residual_out + r * hidden : NULL;
        if (residual) {
            const float *rr = residual + r * hidden;
            for (int64_t i = 0; i < hidden; i++) sum_row[i] = xr[i] + rr[i];
            xr = sum_row;
        }
        float squares = 0.f;
        for (int64_t i = 0; i < hidden; i++) squares += xr[i] * xr[i];
        const float inverse = 1.f / sqrtf(squares / (float)hidden + eps);
        float *o = out + r * hidden;
        for (int64_t i = 0; i < hidden; i++) o[i] = weight[i] * (xr[i] * inverse);
    }
}

void silu_mul_f32(const float *gate_up, int64_t rows, int64_t inter, float *out) {
    for (int64_t r = 0; r < rows; r++) {
        const float *restrict gate = gate_up + r * 2 * inter, *restrict up = gate + inter;
        float *restrict o = out + r * inter;
        for (int64_t i = 0; i < inter; i++) {
            /* the exponential first, in its own statement: GCC 12 then schedules the loop twice
             * as fast as for the same arithmetic in one expression */
            const float e = exp_approx(-gate[i]);
            o[i] = gate[i] * up[i] / (1.f + e);
        }
    }
}

/* One head's NeoX rotation: the halves (a, b) become (a cos - b sin, b cos + a sin). Each
 * product is rounded before the sum, as torch's ops do (no fused multiply-add). */
#ifndef __clang__
__attribute__((optimize("fp-contract=off")))
#endif
static void rotate(const float *x, const float *cos, const float *sin, int64_t dim, float *out) {
#ifdef __clang__
#pragma clang fp contract(off)
#endif
    const int64_t half = dim / 2;
    for (int64_t i = 0; i < half; i++) {
        const float a = x[i] * cos[i], b = -x[i + half] * sin[i];
        out[i] = a + b;
    }
    for (int64_t i = half; i < dim; i++) {
        const float a = x[i] * cos[i], b = x[i - half] * sin[i];
        out[i] = a + b;
    }
}

/* q [tokens, heads, dim] and k, v [tokens, kv_heads, dim] with row strides (floats between
 * tokens); cos and sin [tokens, dim]. Writes the rotated q and k to q_out, k_out (contiguous) and
 * k_out, v into the caches ([slots, kv_heads, dim]) at slots[t]. */
void rotary_store_f32(const float *q, int64_t q_stride, const float *k, int64_t k_stride, const float *v, int64_t v_stride,
                      const float *cos, const float *sin, const int64_t *slots, int64_t tokens, int64_t heads,
                      int64_t kv_heads, int64_t dim, float *q_out, float *k_out, float *k_cache, float *v_cache) {
    const int64_t row = kv_heads * dim;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (int64_t h = 0; h < heads; h++) rotate(q + t * q_stride + h * dim, c, s, dim, q_out + (t * heads + h) * dim);
        for (int64_t h = 0; h < kv_heads; h++) rotate(k + t * k_stride + h * dim, c, s, dim, k_out + (t * kv_heads + h) * dim);
        memcpy(k_cache + slots[t] * row, k_out + t * row, sizeof(float) * row);
        memcpy(v_cache + slots[t] * row, v + t * v_stride, sizeof(float) * row);
    }
}

/* Each row's index of its first largest value (rows [rows, cols], contiguous): lane-wise running
 * maxima with the index where each lane first reached it, then the lanes compared; one pass in
 * whole vectors (torch's CPU argmax is a scalar loop). NaN is never taken as the largest. */
void argmax_rows_f32(const float *values, int64_t rows, int64_t cols, int64_t *out) {
    const v16i lanes = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    for (int64_t r = 0; r < rows; r++) {
        const float *row = values + r * cols;
        float best = -INFINITY;
        int64_t at = 0, c = 0;
        if (cols >= 16 && cols < (int64_t)1 << 31) {
            v16 top = load16(row);
            v16i where = lanes;
            for (c = 16; c + 16 <= cols; c += 16) {
                const v16 next = load16(row + c);
                const v16i larger = next > top; /* strictly: a lane keeps its first maximum */
                top = (v16)((larger & (v16i)next) | (~larger & (v16i)top));
                where = (larger & ((int32_t)c + lanes)) | (~larger & where);
            }
            best = top[0];
            at = where[0];
            for (int i = 1; i < 16; i++)
                if (top[i] > best || (top[i] == best && where[i] < at)) {
                    best = top[i];
                    at = where[i];
                }
        }
        for (; c < cols; c++)
            if (row[c] > best) { /* later columns: only a strictly larger value moves the index */
                best = row[c];
                at = c;
            }
        out[r] = at;
    }
}
