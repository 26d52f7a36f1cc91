"""CUDA graphs of the decoder's one-token step, one per row count (1, 2, 4, ... up to capacity).

A graph's shapes must not change between replays, so every row attends over the whole
self-attention cache (``max_target_positions``) under its mask instead of the longest row's
span, and a step of ``n`` rows replays the graph of the next captured size: the extra rows are
free rows of the batch (their cache writes land at position 0 of a free row, which an admission
overwrites). Inputs go in through one device buffer (tokens, positions) copied from the host in
one transfer. Graphs are captured on first use and dropped when the batch reallocates its caches
(``DecodeBatch._grow``), since they hold those tensors' addresses.
"""

from __future__ import annotations

import torch
from omni_core.scheduler.graph_capture import CUDA_GRAPH_CAPTURE_LOCK

from omni_whisper.model import WhisperModel


class DecodeGraphs:
    def __init__(self, model: WhisperModel, capacity: int):
        self.model = model
        device = model.decoder.embed_tokens.weight.device
        self.sizes = sorted({min(capacity, 1 << i) for i in range(capacity.bit_length() + 1)})
        self.inputs = torch.zeros(2, capacity, dtype=torch.long, device=device)  # tokens, positions
        self.span = model.config.max_target_positions
        self.pool = None  # set with the first graphs
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._caches: torch.Tensor | None = None  # the cache tensor the graphs were captured on
        self.replays = 0

    def logits(self, feed: list[int], lengths: list[int], self_kv, cross_kv) -> torch.Tensor:
        """Logits [n, V] of a decode step of ``n`` rows (``feed`` tokens at positions ``lengths``)."""
        n = len(feed)
        size = min(next(s for s in self.sizes if s >= n), self_kv[0][0].shape[0])  # no more rows than allocated
        if self._caches is not self_kv[0][0]:
            # the old graphs go, and their memory pool with them: a pool is not reused once its
            # last graph is freed (the caching allocator asserts)
            self._graphs.clear()
            self.pool = torch.cuda.graph_pool_handle()
            self._caches = self_kv[0][0]
        host = torch.tensor([feed + [0] * (size - n), lengths + [0] * (size - n)])
        self.inputs[:, :size].copy_(host, non_blocking=False)
        if size not in self._graphs:
            self._graphs[size] = self._capture(size, self_kv, cross_kv)
        graph, out = self._graphs[size]
        graph.replay()
        self.replays += 1
        return out[:n]

    def _forward(self, size: int, self_kv, cross_kv) -> torch.Tensor:
        return self.model.decoder(
            self.inputs[0, :size, None],
            self.inputs[1, :size],
            [(k[:size], v[:size]) for k, v in self_kv],
            [(k[:size], v[:size]) for k, v in cross_kv],
            span=self.span,
        )

    def _capture(self, size: int, self_kv, cross_kv) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        with CUDA_GRAPH_CAPTURE_LOCK, torch.inference_mode():
            # a warm-up run first (lazy initialisation may not happen inside a capture); it
            # writes this step's keys and values, which the replay writes again
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._forward(size, self_kv, cross_kv)
            torch.cuda.current_stream().wait_stream(side)
            with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
                out = self._forward(size, self_kv, cross_kv)
        return graph, out
