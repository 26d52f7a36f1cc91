/* Paged causal attention for prefill on the host, float32: each sequence's new query tokens
 * against its K/V in the paged cache (a cached prefix or earlier chunks included), read through
 * its block table without a gathered copy.
 *
 * Layouts (all contiguous): q and out [tokens, heads, dim], the sequences' tokens one after the
 * other; k_cache and v_cache [slots, kv_heads, dim], slot s being token s % block_size of block
 * s / block_size; block_tables [batch, table_width]; context_lens and query_lens [batch]. The
 * query_lens[b] tokens of sequence b are its last ones (positions context_lens[b] - query_lens[b]
 * onwards, their K/V already in the cache) and a token at position p attends to positions 0..p.
 * Query head h reads KV head h / (heads / kv_heads). dim is a multiple of 16, at most MAX_DIM.
 *
 * Work goes by tiles: the query heads of one KV head over a run of tokens (up to TILE_ROWS rows,
 * fewer where the context is long: a tile's scores stay within the scratch) in three passes:
 * scores of all its rows against the keys up to its last position (8 rows x 16 keys at a time,
 * each key chunk transposed once to [dim][16]); each row's softmax over the positions it may see
 * (the rest set to 0); values weighted by them. Each pass is a loop of independent
 * multiply-adds, which the CPU overlaps (a flash-style loop over one row at a time waited on its
 * chain of dependent steps: 1.3-1.6x slower here).
 */
#include <stdint.h>
#include <string.h>

#include "exp_approx.h"
#include "vec16.h"

#define INLINE static inline __attribute__((always_inline))
#define TILE_ROWS 64
#define MAX_DIM 256
#define SCORE_ROWS 8 /* rows whose scores one pass computes together: 8 independent accumulators */

/* The largest of s[0, n), n >= 1: whole vectors, then a four-round tree (a chain of scalar
 * compares would wait on each one). */
INLINE float largest(const float *s, int64_t n) {
    v16 top = (v16){0} + s[0];
    int64_t k = 0;
    for (; k + 16 <= n; k += 16) top = max16(top, load16(s + k));
    top = max16(top, __builtin_shufflevector(top, top, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    top = max16(top, __builtin_shufflevector(top, top, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    top = max16(top, __builtin_shufflevector(top, top, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    top = max16(top, __builtin_shufflevector(top, top, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    float result = top[0];
    for (; k < n; k++) result = s[k] > result ? s[k] : result;
    return result;
}

static const float zero_row[MAX_DIM]; /* the keys past a tile's last position in its last chunk */

INLINE const float *cache_row(const float *cache, const int64_t *table, int64_t pos, int64_t kv_head, int64_t row,
                              int64_t dim, int64_t block_size) {
    return cache + (table[pos / block_size] * block_size + pos % block_size) * row + kv_head * dim;
}

/* scores[r][k] = scale * q_r . key_k for the tile's rows and keys [0, keys) (keys padded to 16). */
INLINE void tile_scores(const float *const *restrict qrows, int64_t rows, const float *restrict k_cache,
                        const int64_t *restrict table, int64_t keys, int64_t kv_head, int64_t row, int64_t dim,
                        int64_t block_size, float scale, float *restrict scores, int64_t stride) {
    float kt[MAX_DIM * 16];
    for (int64_t k0 = 0; k0 < keys; k0 += 16) {
        for (int i = 0; i < 16; i++) {
            const float *key = k0 + i < keys ? cache_row(k_cache, table, k0 + i, kv_head, row, dim, block_size) : zero_row;
            for (int64_t d = 0; d < dim; d++) kt[d * 16 + i] = key[d];
        }
        int64_t r0 = 0;
        for (; r0 + SCORE_ROWS <= rows; r0 += SCORE_ROWS) {
            v16 dot[SCORE_ROWS] = {{0}};
            for (int64_t d = 0; d < dim; d++) {
                const v16 kd = load16(kt + d * 16);
                for (int r = 0; r < SCORE_ROWS; r++) dot[r] += qrows[r0 + r][d] * kd;
            }
            for (int r = 0; r < SCORE_ROWS; r++) store16(scores + (r0 + r) * stride + k0, dot[r] * scale);
        }
        for (; r0 < rows; r0++) {
            v16 dot = {0};
            for (int64_t d = 0; d < dim; d++) dot += qrows[r0][d] * load16(kt + d * 16);
            store16(scores + r0 * stride + k0, dot * scale);
        }
    }
}

/* One row's scores over [0, seen) become softmax weights, [seen, keys) zeros; returns 1 / their sum. */
INLINE float row_softmax(float *restrict s, int64_t seen, int64_t keys) {
    const float top = largest(s, seen);
    float total = 0.f;
    for (int64_t k = 0; k < seen; k++) {
        const float e = exp_approx(s[k] - top);
        s[k] = e;
        total += e;
    }
    for (int64_t k = seen; k < keys; k++) s[k] = 0.f;
    return 1.f / total;
}

/* out_r = inverse_r * sum_k weights[r][k] value_k for ROWS rows (dim / 16 vectors each). */
INLINE void weighted_values(int ROWS, const float *restrict weights, int64_t stride, const float *restrict inverse,
                            const float *restrict v_cache, const int64_t *restrict table, int64_t keys, int64_t kv_head,
                            int64_t row, int64_t dim, int64_t block_size, float *const *restrict outs) {
    v16 acc[ROWS][MAX_DIM / 16];
    for (int r = 0; r < ROWS; r++)
        for (int64_t c = 0; c < dim / 16; c++) acc[r][c] = (v16){0};
    for (int64_t b0 = 0; b0 < keys; b0 += block_size) {
        const float *block = cache_row(v_cache, table, b0, kv_head, row, dim, block_size);
        const int64_t end = keys - b0 < block_size ? keys - b0 : block_size;
        for (int64_t i = 0; i < end; i++)
            for (int64_t c = 0; c < dim / 16; c++) {
                const v16 value = load16(block + i * row + 16 * c);
                for (int r = 0; r < ROWS; r++) acc[r][c] += weights[r * stride + b0 + i] * value;
            }
    }
    for (int r = 0; r < ROWS; r++)
        for (int64_t c = 0; c < dim / 16; c++) store16(outs[r] + 16 * c, acc[r][c] * inverse[r]);
}

/* One sequence and KV head. Inlined into copies for fixed head sizes, where ``dim`` is a constant. */
INLINE void attend_head(const float *restrict q, const float *restrict k_cache, const float *restrict v_cache,
                        const int64_t *restrict table, int64_t n, int64_t context, int64_t kv_head, int64_t heads,
                        int64_t kv_heads, int64_t dim, int64_t block_size, float scale, float *restrict scores,
                        int64_t scratch_floats, float *restrict out) {
    const int64_t group = heads / kv_heads, row = kv_heads * dim, first = context - n;
    const int64_t stride = (context + 15) / 16 * 16;
    int64_t tile_tokens = scratch_floats / (group * stride);
    const int64_t most = TILE_ROWS / group > 0 ? TILE_ROWS / group : 1;
    tile_tokens = tile_tokens < 1 ? 1 : (tile_tokens > most ? most : tile_tokens);
    /* rows of values summed together: up to 8 accumulators */
    const int value_rows = dim <= 32 ? 4 : (dim <= 64 ? 2 : 1);
    for (int64_t t0 = 0; t0 < n; t0 += tile_tokens) {
        const int64_t tokens = n - t0 < tile_tokens ? n - t0 : tile_tokens, rows = tokens * group;
        const int64_t keys = first + t0 + tokens; /* through the tile's last position */
        const float *qrows[rows];
        float *orows[rows];
        float inverse[rows];
        for (int64_t t = 0; t < tokens; t++)
            for (int64_t g = 0; g < group; g++) {
                const int64_t offset = ((t0 + t) * heads + kv_head * group + g) * dim;
                qrows[t * group + g] = q + offset;
                orows[t * group + g] = out + offset;
            }
        tile_scores(qrows, rows, k_cache, table, keys, kv_head, row, dim, block_size, scale, scores, stride);
        for (int64_t r = 0; r < rows; r++)
            inverse[r] = row_softmax(scores + r * stride, first + t0 + r / group + 1, keys);
        int64_t r0 = 0;
        if (value_rows == 4)
            for (; r0 + 4 <= rows; r0 += 4)
                weighted_values(4, scores + r0 * stride, stride, inverse + r0, v_cache, table, keys, kv_head, row, dim,
                                block_size, orows + r0);
        if (value_rows >= 2)
            for (; r0 + 2 <= rows; r0 += 2)
                weighted_values(2, scores + r0 * stride, stride, inverse + r0, v_cache, table, keys, kv_head, row, dim,
                                block_size, orows + r0);
        for (; r0 < rows; r0++)
            weighted_values(1, scores + r0 * stride, stride, inverse + r0, v_cache, table, keys, kv_head, row, dim,
                            block_size, orows + r0);
    }
}

#define FIXED_DIM(DIM)                                                                                                 \
    static void attend_dim##DIM(const float *q, const float *k_cache, const float *v_cache, const int64_t *table,      \
                                int64_t n, int64_t context, int64_t kv_head, int64_t heads, int64_t kv_heads,          \
                                int64_t dim, int64_t block_size, float scale, float *scores, int64_t scratch_floats,   \
                                float *out) {                                                                          \
        (void)dim;                                                                                                     \
        attend_head(q, k_cache, v_cache, table, n, context, kv_head, heads, kv_heads, DIM, block_size, scale, scores,  \
                    scratch_floats, out);                                                                              \
    }
FIXED_DIM(32)
FIXED_DIM(64)
FIXED_DIM(128)

static void attend_any_dim(const float *q, const float *k_cache, const float *v_cache, const int64_t *table, int64_t n,
                           int64_t context, int64_t kv_head, int64_t heads, int64_t kv_heads, int64_t dim,
                           int64_t block_size, float scale, float *scores, int64_t scratch_floats, float *out) {
    attend_head(q, k_cache, v_cache, table, n, context, kv_head, heads, kv_heads, dim, block_size, scale, scores,
                scratch_floats, out);
}

/* Sequences [0, batch) of the step, their tokens packed from q's first row; ``scores`` is scratch
 * of ``scratch_floats`` floats, at least group * (longest context + 16). Returns 0, or -1 for
 * shapes this kernel does not take (then nothing is written). */
int paged_prefill_attention_f32(const float *q, const float *k_cache, const float *v_cache, const int64_t *block_tables,
                                const int64_t *context_lens, const int64_t *query_lens, int64_t batch, int64_t heads,
                                int64_t kv_heads, int64_t dim, int64_t table_width, int64_t block_size, float scale,
                                float *scores, int64_t scratch_floats, float *out) {
    if (dim % 16 != 0 || dim > MAX_DIM || heads % kv_heads != 0) return -1;
    void (*attend)(const float *, const float *, const float *, const int64_t *, int64_t, int64_t, int64_t, int64_t,
                   int64_t, int64_t, int64_t, float, float *, int64_t, float *) = dim == 32    ? attend_dim32
                                                                : dim == 64  ? attend_dim64
                                                                : dim == 128 ? attend_dim128
                                                                             : attend_any_dim;
    int64_t token = 0;
    for (int64_t b = 0; b < batch; b++) {
        const int64_t n = query_lens[b];
        for (int64_t kh = 0; kh < kv_heads; kh++)
            attend(q + token * heads * dim, k_cache, v_cache, block_tables + b * table_width, n, context_lens[b], kh,
                   heads, kv_heads, dim, block_size, scale, scores, scratch_floats, out + token * heads * dim);
        token += n;
    }
    return 0;
}
