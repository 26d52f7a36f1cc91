"""CUDA graphs for prefill steps of short prompts.

An eager prefill of short prompts is bound by kernel launches (and, with several stage threads in
one process, by the Python that issues them), not arithmetic: a 48-layer MoE model launches well
over a thousand kernels for 60 tokens (50-190 ms on an H100 where its decode step takes 4 ms in a
graph, 11-15 ms in one of these graphs). At one stream two such prefills (Qwen3-Omni's thinker,
then its talker) were most of the time to first audio; under a burst, the steps that prefill
several prompts at once.

A graph is captured per (sequences, tokens a sequence, KV width in blocks): a step's sequences
are padded to the first, each sequence's tokens to the second, so the step's rows are the padded
layout ``[sequences x tokens]`` of SDPA's padded path (keys gathered from each block table up to
the graph's width, the causal mask built on the device from the step's lengths), whose shapes do
not depend on them. A sequence's padded rows follow its own, so the causal mask keeps them out of
its rows; padded rows and padded sequences write the scratch slot, and their outputs are dropped.
Prompts may continue a cached prefix or an earlier chunk.

A step qualifies when its sequences' rotary positions are their cache positions, it returns no
hidden layers, every context fits a captured width, and the model reads nothing but its tensors
for it (``supports_cuda_graphs``, and ``reads_extras_in_prefill(extras)`` false where the model
defines it). The step's embeddings are looked up outside the graph (prompt embeddings and
``before_prefill`` hooks may replace them) and gathered into the padded layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_core import progress
from omni_core.models.attention import AttentionMetadata, ForwardContext
from omni_core.scheduler.graph_capture import capture_cuda_graph
from omni_core.scheduler.host_copy import to_device
from omni_core.scheduler.sequence import Sequence

# padded rows a graph holds at most (sequences x tokens): larger steps are arithmetic-bound
MAX_PADDED_TOKENS = 4096


class PrefillGraphs:
    """Graphs keyed by (sequences, tokens a sequence, KV width in blocks), for a ModelRunner."""

    def __init__(self, runner, batches: list[int], sizes: list[int], widths: list[int], capture: Callable = capture_cuda_graph):
        # capture(step, device, pool) -> (graph with replay() and pool(), step's outputs)
        self.runner = runner
        self.capture_graph = capture
        self.graphs: dict[tuple[int, int, int], tuple[torch.cuda.CUDAGraph, dict[str, Any]]] = {}
        self.replays = 0  # steps that ran in a graph
        bs = runner.block_size
        shapes = [(b, s, w) for b in batches for s in sizes for w in widths if s <= w * bs and b * s <= MAX_PADDED_TOKENS]
        self._capture(sorted(shapes, key=lambda k: (k[0] * k[1], k), reverse=True))

    def key(self, seqs: list[Sequence], capture: frozenset[int]) -> tuple[int, int, int] | None:
        """The graph a prefill step of ``seqs`` replays, or None (it runs eagerly)."""
        if capture or not self.graphs or any(s.rope_positions is not None or s.rope_delta for s in seqs):
            return None
        check = getattr(self.runner.model, "reads_extras_in_prefill", None)
        if check is not None and check([s.extras for s in seqs]):
            return None
        n = max(s.num_scheduled_tokens for s in seqs)
        width = max(-(-(s.num_computed_tokens + s.num_scheduled_tokens) // self.runner.block_size) for s in seqs)
        fits = [k for k in self.graphs if k[0] >= len(seqs) and k[1] >= n and k[2] >= width]
        return min(fits, key=lambda k: (k[0] * k[1], k)) if fits else None

    def prepare(self, seqs: list[Sequence], key: tuple[int, int, int], sample_index: list[int]):
        """The step's integers into the graph's inputs and its packed ids and positions, in one
        copy to the device, and its embeddings looked up; returns (ids, positions, embeddings,
        query lengths) packed, as the eager ``_prepare``. ``sample_index``: the sequences whose
        last row is sampled (they finish their prompt)."""
        runner = self.runner
        _, st = self.graphs[key]
        batch, size, width = key
        query_lens = [s.num_scheduled_tokens for s in seqs]
        context_lens = [s.num_computed_tokens + n for s, n in zip(seqs, query_lens, strict=True)]
        # a chunked prompt holds blocks for its whole length: the graph reads those of its context
        tables = runner._block_tables(seqs)[:, :width]
        ids, seq_t, pos_t, slots = runner._packed_rows(seqs, query_lens, context_lens, tables)
        total = len(ids)
        index = torch.zeros(st["index"].shape[0] + 2 * total, dtype=torch.int64)
        positions, padded_slots, source, last, contexts, queries, table, packed = _index_views(index, batch, size, width)
        # padding rows: position 0, the scratch slot, the first packed row; padding sequences: lengths 1
        starts = torch.tensor(query_lens).cumsum(0) - torch.tensor(query_lens)
        row_t = seq_t * size + torch.arange(total) - starts[seq_t]
        padded_slots.fill_(runner.scratch_slot)
        positions[row_t], padded_slots[row_t], source[row_t] = pos_t, slots, torch.arange(total)
        last[: len(sample_index)] = torch.tensor([b * size + query_lens[b] - 1 for b in sample_index], dtype=torch.int64)
        contexts.fill_(1)
        queries.fill_(1)
        contexts[: len(seqs)], queries[: len(seqs)] = torch.tensor(context_lens), torch.tensor(query_lens)
        table[: len(seqs), : tables.shape[1]] = tables
        packed[:total], packed[total:] = ids, pos_t
        on_device = to_device(index, runner.device)
        st["index"].copy_(on_device[: st["index"].shape[0]])
        ids_t, positions_t = on_device[st["index"].shape[0] :].split(total)
        embeds = runner.model.embed(ids_t)
        runner._insert_prompt_embeds(seqs, embeds)
        return ids_t, positions_t, embeds, query_lens

    def replay(self, key: tuple[int, int, int], embeds: torch.Tensor, sampled: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Runs graph ``key`` on the step's packed embeddings; returns the last row's hidden state
        and logits of each of the ``sampled`` sequences that finish their prompt (graph memory:
        the next replay overwrites them, after this step's work on the stream has read them)."""
        graph, st = self.graphs[key]
        torch.index_select(embeds, 0, st["source"], out=st["embeds"])
        graph.replay()
        self.replays += 1
        return st["last_hidden"][:sampled], st["logits"][:sampled]

    def _static_inputs(self, batch: int, size: int, width: int) -> dict[str, Any]:
        """A graph's inputs; the integers are views of one buffer: positions, slots and source
        rows (a row each), then the last rows, context and query lengths (a sequence each), then
        the block tables."""
        runner = self.runner
        dev = runner.device
        rows = batch * size
        index = torch.zeros(3 * rows + 3 * batch + batch * width, dtype=torch.int64, device=dev)
        positions, slots, source, last, context_lens, query_lens, tables, _ = _index_views(index, batch, size, width)
        slots.fill_(runner.scratch_slot)
        context_lens.fill_(1)
        query_lens.fill_(1)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=tables,
            context_lens=context_lens,
            query_lens=query_lens,
            max_query_len=size,
            block_size=runner.block_size,
            # no host lengths, so the backend takes SDPA's padded path, whose shapes do not depend
            # on them; no padded/packed index: the rows are that path's padded layout already
        )
        return {
            "index": index,
            "positions": positions,
            "source": source,
            "last": last,
            "embeds": torch.zeros(rows, runner.model.hidden_size, dtype=runner.dtype, device=dev),
            "meta": meta,
        }

    @torch.inference_mode()
    def _capture(self, shapes: list[tuple[int, int, int]]) -> None:
        runner = self.runner
        pool = None  # their own pool: decode graphs' outputs may still be read while these replay
        for batch, size, width in progress.each(shapes, "capturing prefill graphs (sequences x tokens x KV widths)"):
            st = self._static_inputs(batch, size, width)

            def step(st=st, batch=batch, size=size):  # bound now: captured within this iteration
                meta = st["meta"]
                meta.cache.clear()
                runner.backend.prepare(meta)
                ctx = ForwardContext(meta, runner.backend, runner.kv_caches, True, [{}] * batch, [size] * batch)
                hidden = runner.model(st["embeds"], st["positions"], ctx)
                last = hidden.index_select(0, st["last"])
                return last, runner.model.compute_logits(last)

            graph, (st["last_hidden"], st["logits"]) = self.capture_graph(step, runner.device, pool)
            pool = graph.pool()
            self.graphs[(batch, size, width)] = (graph, st)
        runner.platform.synchronize(runner.device)


def _index_views(index: torch.Tensor, batch: int, size: int, width: int):
    """A graph's integer inputs as views of one buffer: positions, slots and source rows (a padded
    row each), the last rows, context and query lengths (a sequence each), the block tables, then
    whatever follows (a step's packed ids and positions, on the way to the device)."""
    rows = batch * size
    positions, slots, source = index[: 3 * rows].view(3, rows).unbind(0)
    last, context_lens, query_lens = index[3 * rows : 3 * rows + 3 * batch].view(3, batch).unbind(0)
    end = 3 * rows + 3 * batch + batch * width
    return positions, slots, source, last, context_lens, query_lens, index[3 * rows + 3 * batch : end].view(batch, width), index[end:]
