"""A KV cache for a batch of rows of different lengths, left-padded so that they end together.

Every row's newest token sits in the same column, so a decode step writes one column for the
whole batch with a single slice update; a per-row left padding is masked out. Rows join
(``merge``) and leave (``keep``) only when requests start and finish, so the copies those cost
are paid once per request, not per step. Capacity grows in steps of ``GROWTH`` columns.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

GROWTH = 256


class BatchKVCache:
    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int):
        self.layers = layers
        self.kv_heads = kv_heads
        self.head_dim = head_dim
        self.keys: list[mx.array | None] = [None] * layers
        self.values: list[mx.array | None] = [None] * layers
        self.pad = np.zeros(rows, dtype=np.int64)
        self.end = 0  # columns filled, padding included

    @property
    def rows(self) -> int:
        return len(self.pad)

    def row_lengths(self) -> mx.array:
        """Rotary offset of each row's next token; negative while a left-padded prompt is
        being written, so that its first real token gets position 0."""
        return mx.array((self.end - self.pad).astype(np.int32))

    def attention_mask(self, new_tokens: int) -> mx.array | None:
        if new_tokens == 1 and not self.pad.any():
            return None
        total = self.end + new_tokens
        columns = np.arange(total)[None, None, :]
        query_columns = (self.end + np.arange(new_tokens))[None, :, None]
        visible = (columns <= query_columns) & (columns >= self.pad[:, None, None])
        # a padding query sees itself: no row is all-masked, so no NaN enters the cache
        visible |= columns == query_columns
        return mx.array(visible[:, None, :, :])

    @classmethod
    def for_prompts(cls, layers: int, lengths: list[int], kv_heads: int, head_dim: int) -> BatchKVCache:
        """An empty cache for prompts of ``lengths``, left-padded to the longest."""
        cache = cls(layers, len(lengths), kv_heads, head_dim)
        cache.pad = max(lengths) - np.asarray(lengths, dtype=np.int64)
        return cache

    def update(self, layer: int, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        new = keys.shape[2]
        stop = self.end + new
        cached = self.keys[layer]
        if cached is None or cached.shape[2] < stop:
            capacity = (stop + GROWTH - 1) // GROWTH * GROWTH
            self.keys[layer] = self._grow(cached, capacity, keys.dtype)
            self.values[layer] = self._grow(self.values[layer], capacity, values.dtype)
        self.keys[layer][:, :, self.end : stop, :] = keys
        self.values[layer][:, :, self.end : stop, :] = values
        return self.keys[layer][:, :, :stop, :], self.values[layer][:, :, :stop, :]

    def _grow(self, cached: mx.array | None, capacity: int, dtype) -> mx.array:
        fresh = mx.zeros((self.rows, self.kv_heads, capacity, self.head_dim), dtype=dtype)
        if cached is not None and self.end:
            fresh[:, :, : self.end, :] = cached[:, :, : self.end, :]
        return fresh

    def advance(self, tokens: int) -> None:
        self.end += tokens

    def keep(self, rows: list[int]) -> None:
        """Keep only ``rows`` (in this order); drop the padding every kept row shares."""
        index = mx.array(np.asarray(rows, dtype=np.int32))
        self.pad = self.pad[rows]
        for layer in range(self.layers):
            if self.keys[layer] is not None:
                self.keys[layer] = self.keys[layer][index]
                self.values[layer] = self.values[layer][index]
        shared = int(self.pad.min()) if len(rows) else self.end
        if shared:
            self._shift_left(shared)

    def _shift_left(self, columns: int) -> None:
        for layer in range(self.layers):
            if self.keys[layer] is not None:
                self.keys[layer] = self.keys[layer][:, :, columns:, :]
                self.values[layer] = self.values[layer][:, :, columns:, :]
        self.pad = self.pad - columns
        self.end -= columns

    def merge(self, other: BatchKVCache) -> None:
        """Append ``other``'s rows after this cache's rows."""
        if self.rows == 0:
            self.keys, self.values, self.pad, self.end = other.keys, other.values, other.pad, other.end
            return
        end = max(self.end, other.end)
        capacity = (end + 1 + GROWTH - 1) // GROWTH * GROWTH
        for layer in range(self.layers):
            self.keys[layer] = mx.concatenate(
                [_right_align(self.keys[layer], self.end, end, capacity),
                 _right_align(other.keys[layer], other.end, end, capacity)]
            )
            self.values[layer] = mx.concatenate(
                [_right_align(self.values[layer], self.end, end, capacity),
                 _right_align(other.values[layer], other.end, end, capacity)]
            )
        self.pad = np.concatenate([self.pad + (end - self.end), other.pad + (end - other.end)])
        self.end = end

    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.keys + self.values if t is not None)


def _right_align(array: mx.array, filled: int, end: int, capacity: int) -> mx.array:
    """Place ``array``'s first ``filled`` columns so they end at column ``end`` of ``capacity``."""
    rows, heads, _, dim = array.shape
    out = mx.zeros((rows, heads, capacity, dim), dtype=array.dtype)
    out[:, :, end - filled : end, :] = array[:, :, :filled, :]
    return out
