/* Paged decode attention on the host, float32: one query token per sequence, its K/V read
 * straight from the paged cache through its block table, without a gathered copy.
 *
 * Layouts (all contiguous): q and out [batch, heads, dim]; k_cache and v_cache [slots, kv_heads,
 * dim], slot s being token s % block_size of block s / block_size; block_tables [batch,
 * table_width]; context_lens [batch]; scores: scratch of heads * (longest context) floats. Query
 * head h reads KV head h / (heads / kv_heads).
 *
 * Per sequence: one pass over its keys gives the scores of every query head, then a softmax per
 * head (exp by a polynomial the compiler vectorizes), then one pass over its values. The next
 * block of the table is prefetched while one is read: a sequence's blocks lie anywhere.
 */
#include <stdint.h>
#include <string.h>

#include "exp_approx.h"

#define INLINE static inline __attribute__((always_inline))

/* Eight floats as a generic vector (GCC and Clang lower it to the target's registers). */
typedef float v8 __attribute__((vector_size(32)));

INLINE v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* The lane sums of eight vectors as one vector: three rounds of pairwise shuffles and adds in
 * place of eight horizontal sums. */
INLINE v8 sum8x8(const v8 a[8]) {
    v8 b[4], c[2];
    for (int i = 0; i < 4; i++)
        b[i] = __builtin_shufflevector(a[2 * i], a[2 * i + 1], 0, 8, 2, 10, 4, 12, 6, 14) +
               __builtin_shufflevector(a[2 * i], a[2 * i + 1], 1, 9, 3, 11, 5, 13, 7, 15);
    for (int i = 0; i < 2; i++)
        c[i] = __builtin_shufflevector(b[2 * i], b[2 * i + 1], 0, 1, 8, 9, 4, 5, 12, 13) +
               __builtin_shufflevector(b[2 * i], b[2 * i + 1], 2, 3, 10, 11, 6, 7, 14, 15);
    return __builtin_shufflevector(c[0], c[1], 0, 1, 2, 3, 8, 9, 10, 11) +
           __builtin_shufflevector(c[0], c[1], 4, 5, 6, 7, 12, 13, 14, 15);
}

/* s[i] = exp(s[i] - shift) for s[i] <= shift; returns their sum. */
static float exp_shifted(float *s, int64_t n, float shift) {
    float total = 0.f;
    for (int64_t i = 0; i < n; i++) {
        const float e = exp_approx(s[i] - shift);
        s[i] = e;
        total += e;
    }
    return total;
}

static void prefetch_block(const float *block, int64_t floats) {
    for (int64_t i = 0; i < floats; i += 16) __builtin_prefetch(block + i, 0, 1);
}

/* One sequence. Inlined into copies for fixed head sizes, where ``dim`` is a constant: the dot
 * products over eight keys at a time then unroll into whole vectors. */
INLINE void attend_sequence(const float *restrict qb, const float *restrict k_cache, const float *restrict v_cache,
                            const int64_t *restrict table, int64_t n, int64_t heads, int64_t kv_heads, int64_t dim,
                            int64_t block_size, float scale, float *restrict scores, float *restrict ob) {
    const int64_t group = heads / kv_heads, row = kv_heads * dim, block_floats = block_size * row;
    const int64_t blocks = (n + block_size - 1) / block_size;
    for (int64_t j = 0; j < blocks; j++) {
        const float *restrict kblock = k_cache + table[j] * block_floats;
        if (j + 1 < blocks) prefetch_block(k_cache + table[j + 1] * block_floats, block_floats);
        const int64_t t0 = j * block_size, m = n - t0 < block_size ? n - t0 : block_size;
        int64_t o = 0;
        if (dim % 8 == 0)
            for (; o + 8 <= m; o += 8)
                for (int64_t kh = 0, h = 0; kh < kv_heads; kh++)
                    for (int64_t g = 0; g < group; g++, h++) {
                        const float *restrict qh = qb + h * dim, *restrict krows = kblock + o * row + kh * dim;
                        v8 dots[8];
                        for (int i = 0; i < 8; i++) {
                            v8 acc = {0};
                            for (int64_t c = 0; c < dim / 8; c++) acc += load8(qh + 8 * c) * load8(krows + i * row + 8 * c);
                            dots[i] = acc;
                        }
                        const v8 eight = sum8x8(dots) * scale;
                        memcpy(scores + h * n + t0 + o, &eight, sizeof eight);
                    }
        for (; o < m; o++)
            for (int64_t kh = 0, h = 0; kh < kv_heads; kh++)
                for (int64_t g = 0; g < group; g++, h++) {
                    const float *restrict qh = qb + h * dim, *restrict krow = kblock + o * row + kh * dim;
                    float acc = 0.f;
                    for (int64_t d = 0; d < dim; d++) acc += qh[d] * krow[d];
                    scores[h * n + t0 + o] = acc * scale;
                }
    }
    float inverse[heads];
    for (int64_t h = 0; h < heads; h++) {
        float *sh = scores + h * n, top = sh[0];
        for (int64_t t = 1; t < n; t++) top = sh[t] > top ? sh[t] : top;
        inverse[h] = 1.f / exp_shifted(sh, n, top);
    }
    memset(ob, 0, sizeof(float) * heads * dim);
    for (int64_t j = 0; j < blocks; j++) {
        const float *restrict vblock = v_cache + table[j] * block_floats;
        if (j + 1 < blocks) prefetch_block(v_cache + table[j + 1] * block_floats, block_floats);
        const int64_t t0 = j * block_size, m = n - t0 < block_size ? n - t0 : block_size;
        for (int64_t o = 0; o < m; o++)
            for (int64_t kh = 0, h = 0; kh < kv_heads; kh++)
                for (int64_t g = 0; g < group; g++, h++) {
                    const float p = scores[h * n + t0 + o];
                    const float *restrict vrow = vblock + o * row + kh * dim;
                    float *restrict oh = ob + h * dim;
                    for (int64_t d = 0; d < dim; d++) oh[d] += p * vrow[d];
                }
    }
    for (int64_t h = 0; h < heads; h++)
        for (int64_t d = 0; d < dim; d++) ob[h * dim + d] *= inverse[h];
}

#define FIXED_DIM(DIM)                                                                                                 \
    static void attend_dim##DIM(const float *qb, const float *k_cache, const float *v_cache, const int64_t *table,     \
                                int64_t n, int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size,           \
                                float scale, float *scores, float *ob) {                                               \
        (void)dim;                                                                                                     \
        attend_sequence(qb, k_cache, v_cache, table, n, heads, kv_heads, DIM, block_size, scale, scores, ob);          \
    }
FIXED_DIM(32)
FIXED_DIM(64)
FIXED_DIM(128)

static void attend_any_dim(const float *qb, const float *k_cache, const float *v_cache, const int64_t *table, int64_t n,
                           int64_t heads, int64_t kv_heads, int64_t dim, int64_t block_size, float scale, float *scores,
                           float *ob) {
    attend_sequence(qb, k_cache, v_cache, table, n, heads, kv_heads, dim, block_size, scale, scores, ob);
}

/* Rows [0, batch) of the step; a caller may hand different row ranges to different threads, each
 * with its own scores scratch. */
void paged_decode_attention_f32(const float *q, const float *k_cache, const float *v_cache, const int64_t *block_tables,
                                const int64_t *context_lens, int64_t batch, int64_t heads, int64_t kv_heads, int64_t dim,
                                int64_t table_width, int64_t block_size, float scale, float *scores, float *out) {
    void (*attend)(const float *, const float *, const float *, const int64_t *, int64_t, int64_t, int64_t, int64_t,
                   int64_t, float, float *, float *) = dim == 32    ? attend_dim32
                                                       : dim == 64  ? attend_dim64
                                                       : dim == 128 ? attend_dim128
                                                                    : attend_any_dim;
    for (int64_t b = 0; b < batch; b++) {
        if (context_lens[b] <= 0) { /* nothing to attend to */
            memset(out + b * heads * dim, 0, sizeof(float) * heads * dim);
            continue;
        }
        attend(q + b * heads * dim, k_cache, v_cache, block_tables + b * table_width, context_lens[b], heads, kv_heads,
               dim, block_size, scale, scores, out + b * heads * dim);
    }
}
