/* Linear layers on the host, float32: out = x @ W^T (+ bias) with W pre-packed in panels of 32
 * output columns ([panels][in_features][32], the last panel zero-padded), so that one step of the
 * inner loop reads two whole vectors of one panel row and multiplies them with several input rows.
 *
 * The product itself is in panel_linear.h (shared with the experts' kernel, moe.c).
 * On the development core (AVX-512) it ran the q/k/v, o_proj and down_proj shapes at 1-64 rows
 * 1.02-1.43x faster than the better of MKL (F.linear) and oneDNN, 93-109 GFLOP/s from 32 rows
 * (docs/benchmarks.md, AR engine, CPU); whether an engine takes it is measured per CPU
 * (cpu_linear.pack_cpu_linears).
 */
#include <stdint.h>

#include "panel_linear.h"

/* weight [out_features, in_features] -> packed [ceil(out / 32)][in][32]. */
void pack_linear_weight_f32(const float *weight, int64_t out_features, int64_t in_features, float *packed) {
    pack_panels(weight, out_features, in_features, packed);
}

/* x [rows, in_features] (contiguous), packed as above, bias [out_features] or NULL -> out [rows, out_features]. */
void linear_f32(const float *x, int64_t rows, int64_t in_features, const float *packed, const float *bias,
                int64_t out_features, float *out) {
    panel_linear(x, rows, in_features, packed, bias, out_features, out);
}
