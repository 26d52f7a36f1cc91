"""CUDA graphs for the prefill of one short prompt.

An eager prefill of a short prompt is bound by kernel launches, not arithmetic: a 48-layer MoE
model launches well over a thousand kernels for 60 tokens (50-190 ms on an H100 where its decode
step takes 4 ms in a graph), and at one stream two such prefills (Qwen3-Omni's thinker, then its
talker) are most of the time to first audio. Here a step that prefills one sequence replays a
graph captured for a padded token count and a KV width.

A step qualifies when it holds one sequence, its rotary positions are its cache positions, it
returns no hidden layers, its context fits a captured width, and the model reads nothing but
its tensors for it (``supports_cuda_graphs``, and ``reads_extras_in_prefill(extras)`` false where
the model defines it). The prompt may continue a cached prefix or an earlier chunk: attention
runs SDPA's padded path (keys gathered from the block table up to the graph's width, the causal
mask built from the step's lengths on the device), which has static shapes. Padded rows follow
the prompt's, so the causal mask keeps them out of its rows; their keys and values go to the
scratch slot and their outputs are dropped. The step's embeddings are looked up outside the graph
(prompt embeddings and ``before_prefill`` hooks may replace them) and copied in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_core import progress
from omni_core.models.attention import AttentionMetadata, ForwardContext
from omni_core.scheduler.graph_capture import capture_cuda_graph
from omni_core.scheduler.sequence import Sequence


class PrefillGraphs:
    """Graphs keyed by (padded tokens, KV width in blocks), captured for a ModelRunner."""

    def __init__(self, runner, sizes: list[int], widths: list[int], capture: Callable = capture_cuda_graph):
        # capture(step, device, pool) -> (graph with replay() and pool(), step's outputs)
        self.runner = runner
        self.capture_graph = capture
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, dict[str, Any]]] = {}
        self.replays = 0  # steps that ran in a graph
        bs = runner.block_size
        shapes = sorted(((s, w) for s in sizes for w in widths if s <= w * bs), reverse=True)
        self._capture(shapes)

    def key(self, seqs: list[Sequence], capture: frozenset[int]) -> tuple[int, int] | None:
        """The graph a prefill step of ``seqs`` replays, or None (it runs eagerly)."""
        if len(seqs) != 1 or capture or not self.graphs:
            return None
        seq = seqs[0]
        if seq.rope_positions is not None or seq.rope_delta:
            return None
        check = getattr(self.runner.model, "reads_extras_in_prefill", None)
        if check is not None and check([seq.extras]):
            return None
        n = seq.num_scheduled_tokens
        width = -(-(seq.num_computed_tokens + n) // self.runner.block_size)
        fits = [k for k in self.graphs if k[0] >= n and k[1] >= width]
        return min(fits) if fits else None

    def prepare(self, seqs: list[Sequence], key: tuple[int, int]):
        """The step's integers into the graph's inputs in one copy; returns (ids, positions,
        embeddings, query lengths) as the eager path's ``_prepare`` does."""
        runner = self.runner
        _, st = self.graphs[key]
        size, width = key
        seq = seqs[0]
        bs = runner.block_size
        start, n = seq.num_computed_tokens, seq.num_scheduled_tokens
        context = start + n
        positions = list(range(start, context))
        slots = [seq.block_table[p // bs] * bs + p % bs for p in positions]
        pad = size - n
        # a chunked prompt holds blocks for its whole length: the graph reads those of its context
        table = seq.block_table[:width] + [0] * (width - len(seq.block_table))
        # padding rows: token 0, position 0, the scratch slot
        host = torch.tensor(seq.token_ids[start:context] + [0] * pad + positions + [0] * pad + slots + [runner.scratch_slot] * pad
                            + [n - 1, context, n] + table, dtype=torch.int64)
        if runner.platform.accelerator:  # pinned: the copy queues behind the stream's work instead of waiting for it
            host = host.pin_memory()
        st["index"].copy_(host, non_blocking=True)
        ids = st["ids"][:n]
        embeds = runner.model.embed(ids)
        runner._insert_prompt_embeds(seqs, embeds)
        return ids, st["positions"][:n], embeds, [n]

    def replay(self, key: tuple[int, int], embeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs graph ``key`` on the step's embeddings; returns the last row's hidden state and
        logits (graph memory: the next replay overwrites them, after this step's work on the
        stream has read them)."""
        graph, st = self.graphs[key]
        st["embeds"][: embeds.shape[0]].copy_(embeds)
        graph.replay()
        self.replays += 1
        return st["last_hidden"], st["logits"]

    def _static_inputs(self, size: int, width: int) -> dict[str, Any]:
        """A graph's inputs; the integers are views of one buffer: ids, positions, slots (``size``
        each), then the last row, the context and query lengths, then the block table."""
        runner = self.runner
        dev = runner.device
        index = torch.zeros(3 * size + 3 + width, dtype=torch.int64, device=dev)
        ids, positions, slots = index[: 3 * size].view(3, size).unbind(0)
        slots.fill_(runner.scratch_slot)
        index[3 * size + 1 : 3 * size + 3] = 1  # context and query lengths
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=index[3 * size + 3 :].view(1, width),
            context_lens=index[3 * size + 1 : 3 * size + 2],
            query_lens=index[3 * size + 2 : 3 * size + 3],
            max_query_len=size,
            block_size=runner.block_size,
            # one sequence: every padded row is its packed row; no host lengths, so the backend
            # takes SDPA's padded path, whose shapes do not depend on them
            padded_index=torch.arange(size, device=dev),
            packed_index=torch.arange(size, device=dev),
        )
        return {
            "index": index,
            "ids": ids,
            "positions": positions,
            "last": index[3 * size : 3 * size + 1],
            "embeds": torch.zeros(size, runner.model.hidden_size, dtype=runner.dtype, device=dev),
            "meta": meta,
        }

    @torch.inference_mode()
    def _capture(self, shapes: list[tuple[int, int]]) -> None:
        runner = self.runner
        pool = None  # their own pool: decode graphs' outputs may still be read while these replay
        for size, width in progress.each(shapes, "capturing prefill graphs (tokens x KV widths)"):
            st = self._static_inputs(size, width)

            def step(st=st, size=size):  # bound now: captured within this iteration
                meta = st["meta"]
                meta.cache.clear()
                runner.backend.prepare(meta)
                ctx = ForwardContext(meta, runner.backend, runner.kv_caches, True, [{}], [size])
                hidden = runner.model(st["embeds"], st["positions"], ctx)
                last = hidden.index_select(0, st["last"])
                return last, runner.model.compute_logits(last)

            graph, (st["last_hidden"], st["logits"]) = self.capture_graph(step, runner.device, pool)
            pool = graph.pool()
            self.graphs[(size, width)] = (graph, st)
        runner.platform.synchronize(runner.device)
