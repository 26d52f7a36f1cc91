/* The host kernels' float32 linear product on weights packed in panels of 32 output columns
 * ([panels][in_features][32], the last panel zero-padded): one step of the inner loop reads two
 * whole vectors of one panel row and multiplies them with several input rows (blocks of 6, then
 * 2, then 1: enough independent accumulators to keep the multiply-add units busy); the panel
 * stays in cache while all rows pass. Included by linear.c and moe.c. */
#ifndef OMNI_PANEL_LINEAR_H
#define OMNI_PANEL_LINEAR_H

#include <stdint.h>
#include <string.h>

#include "vec16.h"

#define INLINE static inline __attribute__((always_inline))
#define PANEL 32

/* ROWS rows of x times one panel, into columns [col0, col0 + 32) of out (those below out_features). */
INLINE void rows_by_panel(int ROWS, const float *restrict x, int64_t in_features, const float *restrict panel,
                          const float *restrict bias, int64_t col0, int64_t out_features, float *restrict out) {
    v16 acc[ROWS][2];
    for (int r = 0; r < ROWS; r++) acc[r][0] = acc[r][1] = (v16){0};
    for (int64_t k = 0; k < in_features; k++) {
        const v16 w0 = load16(panel + k * PANEL), w1 = load16(panel + k * PANEL + 16);
        for (int r = 0; r < ROWS; r++) {
            const float a = x[r * in_features + k];
            acc[r][0] += a * w0;
            acc[r][1] += a * w1;
        }
    }
    const int64_t cols = out_features - col0 < PANEL ? out_features - col0 : PANEL;
    for (int r = 0; r < ROWS; r++) {
        float sums[PANEL];
        store16(sums, acc[r][0]);
        store16(sums + 16, acc[r][1]);
        float *o = out + r * out_features + col0;
        if (bias)
            for (int64_t j = 0; j < cols; j++) o[j] = sums[j] + bias[col0 + j];
        else
            memcpy(o, sums, sizeof(float) * cols);
    }
}

/* x [rows, in_features] (contiguous) times the packed weight -> out [rows, out_features]. */
INLINE void panel_linear(const float *x, int64_t rows, int64_t in_features, const float *packed, const float *bias,
                         int64_t out_features, float *out) {
    const int64_t panels = (out_features + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++) {
        const float *panel = packed + p * in_features * PANEL;
        int64_t r = 0;
        for (; r + 6 <= rows; r += 6)
            rows_by_panel(6, x + r * in_features, in_features, panel, bias, p * PANEL, out_features, out + r * out_features);
        for (; r + 2 <= rows; r += 2)
            rows_by_panel(2, x + r * in_features, in_features, panel, bias, p * PANEL, out_features, out + r * out_features);
        for (; r < rows; r++)
            rows_by_panel(1, x + r * in_features, in_features, panel, bias, p * PANEL, out_features, out + r * out_features);
    }
}

/* weight [out_features, in_features] -> packed [ceil(out / 32)][in][32]. */
INLINE void pack_panels(const float *weight, int64_t out_features, int64_t in_features, float *packed) {
    const int64_t panels = (out_features + PANEL - 1) / PANEL;
    for (int64_t p = 0; p < panels; p++)
        for (int64_t k = 0; k < in_features; k++)
            for (int64_t j = 0; j < PANEL; j++) {
                const int64_t col = p * PANEL + j;
                packed[(p * in_features + k) * PANEL + j] = col < out_features ? weight[col * in_features + k] : 0.f;
            }
}

#endif
