/* A mixture-of-experts feed-forward on the host, float32, in one call a layer: a token's output
 * is the sum over its top-k experts of weight * down(silu(gate(x)) * up(x)). Pairs (token,
 * expert) are sorted by expert; each expert that has pairs gathers their rows and runs its
 * gate/up and down projections on them with the panel product (panel_linear.h), its weights
 * packed once (gate/up [2I, H] and down [H, I] of every expert, each in panels of 32 columns).
 * One call replaces the torch path's six or so operations per expert, whose dispatch costs more
 * than their arithmetic at decode sizes.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "panel_linear.h"

/* Every expert's gate/up weight [E][2I][H] and down weight [E][H][I] into panels. */
void pack_experts_f32(const float *gate_up, const float *down, int64_t experts, int64_t hidden, int64_t inter,
                      float *gate_up_packed, float *down_packed) {
    const int64_t gu_size = (2 * inter + PANEL - 1) / PANEL * PANEL * hidden;
    const int64_t d_size = (hidden + PANEL - 1) / PANEL * PANEL * inter;
    for (int64_t e = 0; e < experts; e++) {
        pack_panels(gate_up + e * 2 * inter * hidden, 2 * inter, hidden, gate_up_packed + e * gu_size);
        pack_panels(down + e * hidden * inter, hidden, inter, down_packed + e * d_size);
    }
}

/* x [tokens][hidden]; ids, weights [tokens][top_k]; out [tokens][hidden] (overwritten). Returns 0,
 * -1 for an expert id outside [0, experts) (nothing written), -2 when memory runs out. Scratch is
 * sized for the busiest expert's rows. */
int moe_f32(const float *x, int64_t tokens, int64_t hidden, const int64_t *ids, const float *weights, int64_t top_k,
            const float *gate_up_packed, const float *down_packed, int64_t experts, int64_t inter, float *out) {
    const int64_t pairs = tokens * top_k;
    const int64_t gu_size = (2 * inter + PANEL - 1) / PANEL * PANEL * hidden;
    const int64_t d_size = (hidden + PANEL - 1) / PANEL * PANEL * inter;
    for (int64_t p = 0; p < pairs; p++)
        if (ids[p] < 0 || ids[p] >= experts) return -1;
    int64_t *start = calloc((size_t)experts + 1, sizeof(int64_t));
    int64_t *fill = malloc(sizeof(int64_t) * (size_t)experts);
    int64_t *order = malloc(sizeof(int64_t) * (size_t)(pairs ? pairs : 1));
    if (!start || !fill || !order) {
        free(start), free(fill), free(order);
        return -2;
    }
    for (int64_t p = 0; p < pairs; p++) start[ids[p] + 1]++;
    int64_t busiest = 0;
    for (int64_t e = 0; e < experts; e++) {
        if (start[e + 1] > busiest) busiest = start[e + 1];
        start[e + 1] += start[e];
    }
    memcpy(fill, start, sizeof(int64_t) * (size_t)experts);
    for (int64_t p = 0; p < pairs; p++) order[fill[ids[p]]++] = p;  /* stable: pairs in token order within an expert */
    float *rows = malloc(sizeof(float) * (size_t)(busiest * (2 * hidden + 3 * inter) + 1));
    if (!rows) {
        free(start), free(fill), free(order);
        return -2;
    }
    memset(out, 0, sizeof(float) * (size_t)(tokens * hidden));
    float *gate_up = rows + busiest * hidden, *act = gate_up + busiest * 2 * inter, *y = act + busiest * inter;
    for (int64_t e = 0; e < experts; e++) {
        const int64_t first = start[e], count = start[e + 1] - start[e];
        if (!count) continue;
        for (int64_t j = 0; j < count; j++)
            memcpy(rows + j * hidden, x + (order[first + j] / top_k) * hidden, sizeof(float) * (size_t)hidden);
        panel_linear(rows, count, hidden, gate_up_packed + e * gu_size, 0, 2 * inter, gate_up);
        for (int64_t j = 0; j < count; j++) {
            const float *g = gate_up + j * 2 * inter, *u = g + inter;
            float *a = act + j * inter;
            for (int64_t n = 0; n < inter; n++) a[n] = g[n] / (1.f + expf(-g[n])) * u[n];
        }
        panel_linear(act, count, inter, down_packed + e * d_size, 0, hidden, y);
        for (int64_t j = 0; j < count; j++) {
            const int64_t pair = order[first + j];
            const float w = weights[pair];
            float *o = out + (pair / top_k) * hidden;
            const float *v = y + j * hidden;
            for (int64_t h = 0; h < hidden; h++) o[h] += w * v[h];
        }
    }
    free(rows), free(order), free(fill), free(start);
    return 0;
}
