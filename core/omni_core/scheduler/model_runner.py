"""Runs one engine step on the model: builds the packed batch, the paged-KV metadata, the forward,
the logits of sampling sequences, hooks and sampling.

The KV cache is one tensor ``[2, layers, (num_blocks + 1) * block_size, kv_heads, head_dim]``;
the extra block is scratch that padded rows of a CUDA graph write into. On CUDA, decode steps of
models that allow it replay CUDA graphs captured for a set of batch sizes (the batch is padded to
the next captured size); a graph also looks up the tokens' embeddings (unless a ``before_decode``
hook may replace them) and takes every row's argmax, which all-greedy batches use as their tokens.
Prefill steps of short prompts replay graphs of their own (``prefill_graphs.PrefillGraphs``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from omni_core import progress
from omni_core.models import kernels, native
from omni_core.models.attention import AttentionMetadata, ForwardContext
from omni_core.models.cpu_linear import pack_cpu_linears
from omni_core.models.paged_backend import resolve_attention_backend
from omni_core.platforms import Platform, platform_for
from omni_core.scheduler.graph_capture import capture_cuda_graph
from omni_core.scheduler.hooks import StepBatch
from omni_core.scheduler.host_copy import to_device
from omni_core.scheduler.prefill_graphs import PrefillGraphs
from omni_core.scheduler.sampler import Sampler, SamplingTensors, build_sampling_tensors
from omni_core.scheduler.sequence import Sequence


@dataclass
class LaunchedStep:
    """A step whose work is enqueued on the device: ``result()`` brings its sampled tokens to the
    host (the step's one wait) and returns (indices of sequences that sampled, their tokens,
    per-sequence step tensors by batch index)."""

    seqs: list[Sequence]
    sample_index: list[int]
    token_ids: torch.Tensor | None  # on the device, one per sampled sequence
    step_outputs: dict[int, dict[str, Any]]
    host_tokens: torch.Tensor | None = None
    copied: Any = None  # the platform's event recorded after the copy

    def copy_tokens_to_host(self, platform: Platform, written: torch.Tensor | None = None) -> None:
        """Start the tokens' copy to pinned host memory; ``result()`` then waits for it alone.
        ``written``: pinned host memory the step's kernels store the tokens into themselves (a
        graph's argmax): no copy, ``result()`` waits for the step and reads it."""
        if written is None:
            written = torch.empty(self.token_ids.shape, dtype=self.token_ids.dtype, pin_memory=True)
            written.copy_(self.token_ids, non_blocking=True)
        self.host_tokens = written
        self.copied = platform.record_event()

    def result(self) -> tuple[list[int], list[int], dict[int, dict[str, Any]]]:
        if self.token_ids is None:
            return self.sample_index, [], self.step_outputs
        if self.copied is not None:
            self.copied.synchronize()
            return self.sample_index, self.host_tokens.tolist(), self.step_outputs
        return self.sample_index, self.token_ids.tolist(), self.step_outputs


class ModelRunner:
    def __init__(self, model, num_blocks: int, block_size: int, device: torch.device, dtype: torch.dtype, hooks: dict[str, Any], backend=None, max_model_len: int = 4096, cuda_graph_sizes: tuple[int, ...] = (), cuda_graph_kv_lens: tuple[int, ...] = (),
                 prefill_graph_tokens: tuple[int, ...] = (), prefill_graph_batches: tuple[int, ...] = (1,)):
        self.model = model
        self.device = device
        self.platform = platform_for(device)
        self.dtype = dtype
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.hooks = hooks
        # a decode graph looks its tokens' embeddings up itself unless a hook may replace them
        self.embed_in_graph = "before_decode" not in hooks
        self.backend = resolve_attention_backend(backend, device)  # the platform's (triton on CUDA when it imports), else sdpa
        # a decode graph's argmax kernel also writes its tokens into the graph's input ids, so a
        # greedy step launched ahead of the same graph needs no copy of them (a device copy cost 6
        # us a batch-1 step on the H200); not where a hook reads ``batch.input_ids`` after the
        # replay (``sample``, ``post_decode``), which would then see the new tokens
        self.fused_ops = getattr(self.backend, "fused_ops", False)  # the backend's fused kernels (argmax among them) run
        self.argmax_feeds_ids = self.fused_ops and not {"sample", "post_decode"} & set(hooks)
        self.ids_reused = 0  # graph steps that took their ids from the previous replay's argmax
        self.tokens_written_to_host = 0  # graph steps whose tokens were read where the argmax stored them
        if device.type == "cpu":
            native.build_all()  # the host kernels compile here, not in the first request's step
            if not self.fused_ops:  # the fused kernels read the weights
                pack_cpu_linears(model)  # oneDNN's and the host kernel's layouts, in place of the weights (cpu_linear)
        self.sampler = Sampler()
        self.last_sampling: tuple[tuple[int, ...], SamplingTensors] | None = None  # (seq ids, their tensors)
        spec = model.kv_cache_spec
        slots = (num_blocks + 1) * block_size
        self.kv_cache = torch.zeros(2, spec.num_layers, slots, spec.num_kv_heads, spec.head_dim, dtype=dtype, device=device)
        self.kv_caches = [(self.kv_cache[0, i], self.kv_cache[1, i]) for i in range(spec.num_layers)]
        self.scratch_slot = num_blocks * block_size
        self.max_blocks_per_seq = (max_model_len + block_size - 1) // block_size
        # (batch size, block-table width) -> graph; narrow widths keep the KV gather short
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}
        graphs = self.platform.supports_graphs and getattr(model, "supports_cuda_graphs", False)
        kv_widths = {min(self.max_blocks_per_seq, -(-t // block_size)) for t in cuda_graph_kv_lens}
        if cuda_graph_sizes and graphs:
            self._capture_graphs(sorted(set(cuda_graph_sizes)), sorted(kv_widths | {self.max_blocks_per_seq}))
        # prefills of short prompts (scheduler/prefill_graphs.py); longer contexts than the
        # graphs' widths prefill eagerly (a padded mask over the whole context grows with it)
        self.prefill_graphs = None
        if prefill_graph_tokens and prefill_graph_batches and kv_widths and graphs:
            self.prefill_graphs = PrefillGraphs(self, sorted(set(prefill_graph_batches)), sorted(set(prefill_graph_tokens)), sorted(kv_widths))

    @torch.inference_mode()
    def warm_up_prefill(self, token_budget: int) -> None:
        """Eager prefill passes (the engine runs them at start-up on an accelerator), hooks left out: one
        prompt of lengths on both sides of the kernels' size classes, and batches of short
        prompts, each within ``token_budget`` tokens and the cache. Triton's kernels (the fused
        MoE's grouped matmuls, attention) build one variant per class of sizes on first use,
        which otherwise the first requests of each new batch shape wait for. The prompts' KV
        goes to blocks that no request holds yet."""
        shapes = [[n] for n in (1, 3, 16, 17, 100, 128, 129, 1000, 1024, 1031, 4096, 4099)] + [[61] * 7, [60] * 8, [60] * 32]
        bs = self.block_size
        for lengths in shapes:
            widths = [-(-n // bs) for n in lengths]
            if sum(lengths) > token_budget or max(lengths) > self.max_blocks_per_seq * bs or sum(widths) > self.num_blocks:
                continue
            starts = [sum(widths[:b]) for b in range(len(lengths))]
            tables = torch.tensor([[start + j for j in range(max(widths))] for start in starts], dtype=torch.int64)
            positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
            seq_t = torch.cat([torch.full((n,), b, dtype=torch.int64) for b, n in enumerate(lengths)])
            slots = tables[seq_t, positions // bs] * bs + positions % bs
            lens = torch.tensor(lengths, dtype=torch.int64, device=self.device)
            meta = AttentionMetadata(slots.to(self.device), tables.to(self.device), lens, lens, max(lengths), bs)
            meta.host_query_lens, meta.host_context_lens = lengths, lengths
            self._pack_indices(meta, lengths, seq_t)
            ctx = ForwardContext(meta, self.backend, self.kv_caches, True, [{} for _ in lengths], lengths)
            self.backend.prepare(meta)
            ids = torch.zeros(len(positions), dtype=torch.int64, device=self.device)
            hidden = self.model(self.model.embed(ids), positions.to(self.device), ctx)
            self.model.compute_logits(hidden[(lens.cumsum(0) - 1)])
        self.platform.synchronize(self.device)

    @staticmethod
    def kv_bytes_per_block(model, block_size: int, dtype: torch.dtype) -> int:
        spec = model.kv_cache_spec
        itemsize = torch.empty((), dtype=dtype).element_size()
        return 2 * spec.num_layers * block_size * spec.num_kv_heads * spec.head_dim * itemsize

    # ---- batch preparation -------------------------------------------------------------------

    def _block_tables(self, seqs: list[Sequence]) -> torch.Tensor:
        width = max(len(s.block_table) for s in seqs)
        rows = [s.block_table + [0] * (width - len(s.block_table)) for s in seqs]
        return torch.tensor(rows, dtype=torch.int64)

    def _prepare(self, seqs: list[Sequence], is_prefill: bool, ahead_ids: torch.Tensor | None = None):
        bs, dev = self.block_size, self.device
        query_lens = [s.num_scheduled_tokens for s in seqs]
        block_tables = self._block_tables(seqs)
        max_q = max(query_lens)
        if max_q == 1:
            # one token per sequence (decode): every per-token list is per sequence, slots come
            # straight from the block tables, and all of it goes over in one tensor
            ids, positions, slots, context_lens = self._decode_rows(seqs, ahead_ids is not None)
            rows = torch.tensor([ids, positions, slots, context_lens, query_lens], dtype=torch.int64).to(dev, non_blocking=True)
            ids_t, pos_t, slots, ctx_t, qlen_t = rows.unbind(0)
            if ahead_ids is not None:
                ids_t.copy_(ahead_ids)
        else:
            context_lens = [s.num_computed_tokens + n for s, n in zip(seqs, query_lens, strict=True)]
            ids_t, seq_t, pos_t, slots = self._packed_rows(seqs, query_lens, context_lens, block_tables)
            ctx_t = torch.tensor(context_lens, dtype=torch.int64)
            qlen_t = torch.tensor(query_lens, dtype=torch.int64)
            ids_t, pos_t, slots, ctx_t, qlen_t = (t.to(dev, non_blocking=True) for t in (ids_t, pos_t, slots, ctx_t, qlen_t))
        model_pos = self._rotary_positions(seqs, query_lens, context_lens)
        if model_pos is not None:
            model_pos = model_pos.to(dev, non_blocking=True)
        meta = AttentionMetadata(
            slot_mapping=slots,
            block_tables=block_tables.to(dev, non_blocking=True),
            context_lens=ctx_t,
            query_lens=qlen_t,
            max_query_len=max_q,
            block_size=bs,
        )
        meta.host_query_lens, meta.host_context_lens = query_lens, context_lens
        if max_q > 1:
            self._pack_indices(meta, query_lens, seq_t)
        embeds = self.model.embed(ids_t)
        if is_prefill:
            self._insert_prompt_embeds(seqs, embeds)
        return ids_t, pos_t, embeds, meta, query_lens, model_pos

    def _packed_rows(self, seqs: list[Sequence], query_lens: list[int], context_lens: list[int], block_tables: torch.Tensor):
        """A prefill step's packed tokens on the host: (ids, each one's sequence, position, cache
        slot), sequence after sequence."""
        bs = self.block_size
        ids = [t for seq, n, c in zip(seqs, query_lens, context_lens, strict=True) for t in seq.token_ids[c - n : c]]
        seq_t = torch.repeat_interleave(torch.arange(len(seqs)), torch.tensor(query_lens))
        pos_t = torch.cat([torch.arange(c - n, c, dtype=torch.int64) for n, c in zip(query_lens, context_lens, strict=True)])
        slots = block_tables[seq_t, pos_t // bs] * bs + pos_t % bs
        return torch.tensor(ids, dtype=torch.int64), seq_t, pos_t, slots

    def _pack_indices(self, meta: AttentionMetadata, query_lens: list[int], seq_t: torch.Tensor) -> None:
        """A prefill step's ``padded_index`` and ``packed_index`` (AttentionMetadata); ``seq_t``:
        each packed token's sequence."""
        max_q = max(query_lens)
        starts = torch.tensor([0] + query_lens[:-1], dtype=torch.int64).cumsum(0)
        within = torch.arange(len(seq_t)) - starts[seq_t]
        meta.padded_index = (seq_t * max_q + within).to(self.device)
        q_pos = torch.arange(max_q)
        packed = starts[:, None] + torch.minimum(q_pos[None, :], torch.tensor(query_lens)[:, None] - 1)
        meta.packed_index = packed.reshape(-1).to(self.device)

    @staticmethod
    def _rotary_positions(seqs: list[Sequence], query_lens: list[int], context_lens: list[int]) -> torch.Tensor | None:
        """The model's positions of a step's tokens where a sequence's differ from their cache
        positions (``Sequence.rope_positions``): ``[axes, T]`` when a prompt has several axes
        (the others repeat theirs on every axis), else ``[T]``; None where none differ."""
        if all(s.rope_positions is None and not s.rope_delta for s in seqs):
            return None
        if all(n == 1 and c > s.num_prompt_tokens for s, n, c in zip(seqs, query_lens, context_lens, strict=True)):
            # generated tokens only (decode): one position each, the index plus the offset
            return torch.tensor([c - 1 + s.rope_delta for s, c in zip(seqs, context_lens, strict=True)], dtype=torch.int64)
        parts = [s.rotary_positions(c - n, c) for s, n, c in zip(seqs, query_lens, context_lens, strict=True)]
        axes = max(p.shape[0] if p.dim() == 2 else 1 for p in parts)
        if axes == 1:
            return torch.cat(parts)
        return torch.cat([p if p.dim() == 2 else p.expand(axes, -1) for p in parts], dim=1)

    def _decode_rows(self, seqs: list[Sequence], ahead: bool = False) -> tuple[list[int], list[int], list[int], list[int]]:
        """(token ids, positions, cache slots, context lengths) of a decode step's one token per
        sequence: its last token, or with ``ahead`` the one sampled after it, which is still on
        the device (its id here is a placeholder, 0)."""
        bs = self.block_size
        context_lens = [len(s) + 1 for s in seqs] if ahead else [len(s) for s in seqs]
        positions = [c - 1 for c in context_lens]
        slots = [s.block_table[p // bs] * bs + p % bs for s, p in zip(seqs, positions, strict=True)]
        ids = [0] * len(seqs) if ahead else [s.token_ids[-1] for s in seqs]
        return ids, positions, slots, context_lens

    def _insert_prompt_embeds(self, seqs: list[Sequence], embeds: torch.Tensor) -> None:
        offset = 0
        for seq in seqs:
            start, n = seq.num_computed_tokens, seq.num_scheduled_tokens
            if seq.prompt_embeds is not None and start < seq.num_prompt_tokens:
                stop = min(start + n, seq.num_prompt_tokens)
                embeds[offset : offset + stop - start] = seq.prompt_embeds[start:stop].to(embeds.device, embeds.dtype)
            offset += n

    # ---- one step ----------------------------------------------------------------------------

    def run(self, seqs: list[Sequence], is_prefill: bool) -> tuple[list[int], list[int], dict[int, dict[str, Any]]]:
        """Returns (indices of sequences that sampled, their tokens, per-sequence step tensors by batch index)."""
        return self.launch(seqs, is_prefill).result()

    @torch.inference_mode()
    def launch(self, seqs: list[Sequence], is_prefill: bool, ahead_of: LaunchedStep | None = None) -> LaunchedStep:
        """Enqueues one step; its tokens come to the host on ``result()``. ``ahead_of``: a decode
        step whose tokens are still on the device: this decode step takes them as its input
        tokens (one per sequence, ``seqs`` a subset of that step's in its order), so it can be
        launched before they are read. On CUDA the tokens go to the host without waiting:
        ``result()`` then waits for this step alone."""
        ahead_ids = None
        if ahead_of is not None:
            ahead_ids = ahead_of.token_ids
            if seqs != ahead_of.seqs:  # some sequences stop with the step in flight
                row = {s.seq_id: b for b, s in enumerate(ahead_of.seqs)}
                ahead_ids = ahead_ids[to_device(torch.tensor([row[s.seq_id] for s in seqs], dtype=torch.int64), self.device)]
        capture = frozenset(layer for s in seqs for layer in s.capture_layers(is_prefill))
        graph_key = None
        if self.graphs and not is_prefill and not capture:
            graph_key = self._graph_key(len(seqs), max(len(s.block_table) for s in seqs))
        prefill_key = self.prefill_graphs.key(seqs, capture) if is_prefill and self.prefill_graphs is not None else None
        if is_prefill:  # the sequences that finish their prompt in this step
            sample_index = [b for b, s in enumerate(seqs) if s.num_computed_tokens + s.num_scheduled_tokens == len(s)]
        else:
            sample_index = list(range(len(seqs)))
        if graph_key is not None:
            ids, positions, embeds, meta, query_lens = self._prepare_graph_decode(seqs, graph_key, ahead_ids)
            model_positions = None
        elif prefill_key is not None:
            ids, positions, embeds, query_lens = self.prefill_graphs.prepare(seqs, prefill_key, sample_index)
        else:
            ids, positions, embeds, meta, query_lens, model_positions = self._prepare(seqs, is_prefill, ahead_ids)
        batch = self._step_batch(seqs, is_prefill, ids, embeds, positions, query_lens, sample_index, ahead_ids)
        before = self.hooks.get("before_prefill" if is_prefill else "before_decode")
        if before is not None:
            before(batch)
        extras = [s.extras for s in seqs]
        logits = hidden_last = greedy = None
        if graph_key is not None:
            hidden_last, logits, greedy = self._replay(graph_key, batch.input_embeds, len(seqs))
            captured = {}
        elif prefill_key is not None:
            hidden_last, logits = self.prefill_graphs.replay(prefill_key, batch.input_embeds, len(sample_index))
            captured = {}
        else:
            ctx = ForwardContext(meta, self.backend, self.kv_caches, is_prefill, extras, query_lens, capture)
            self.backend.prepare(meta)
            hidden = self.model(batch.input_embeds, positions if model_positions is None else model_positions, ctx)
            captured = ctx.captured
            if sample_index:
                ends = torch.tensor(query_lens, dtype=torch.int64).cumsum(0) - 1
                hidden_last = hidden[ends[sample_index].to(hidden.device)] if is_prefill else hidden
                logits = self.model.compute_logits(hidden_last)
        token_ids = None
        if sample_index:
            sampled_seqs = [seqs[b] for b in sample_index]
            if "sample" in self.hooks:
                token_ids = self.hooks["sample"](batch, logits)
            if token_ids is None:
                tensors = self._sampling_tensors(sampled_seqs, logits, ahead=int(ahead_of is not None))
                # a graph step computed every row's argmax already
                token_ids = greedy if graph_key is not None and tensors.argmax_only else self.sampler(logits, tensors)
            post = self.hooks.get("post_prefill" if is_prefill else "post_decode")
            if post is not None:
                replaced = post(batch, hidden_last, logits, token_ids)
                if replaced is not None:
                    token_ids = replaced
        step = LaunchedStep(seqs, sample_index, token_ids, self._per_sequence_outputs(seqs, batch, captured, query_lens, sample_index))
        if token_ids is not None and self.platform.accelerator:
            # always through pinned memory and an event, whose wait releases the GIL: other stage
            # threads of the process (a vocoder's) run their Python meanwhile
            written = self._tokens_in_host_memory(graph_key, len(seqs)) if token_ids is greedy else None
            step.copy_tokens_to_host(self.platform, written)
        return step

    def _tokens_in_host_memory(self, graph_key: tuple[int, int] | None, n: int) -> torch.Tensor | None:
        """Where the graph just replayed stored its argmax tokens on the host (its ``host_tokens``
        row of this step: the turn ``_prepare_graph_decode`` took), or None. The rows are taken in
        turn and the engine reads a step's tokens before it launches the step after the next, so
        a row is read before it is written again."""
        st = self.graphs[graph_key][1] if graph_key is not None else {}
        if "host_tokens" not in st:
            return None
        self.tokens_written_to_host += 1
        return st["host_tokens"][st["host_turn"] ^ 1, :n]

    def _sampling_tensors(self, seqs: list[Sequence], logits: torch.Tensor, ahead: int = 0) -> SamplingTensors:
        # consecutive decode steps of the same batch keep their parameter tensors
        key = tuple(s.seq_id for s in seqs)
        reuse = self.last_sampling[1] if self.last_sampling is not None and self.last_sampling[0] == key else None
        tensors = build_sampling_tensors(seqs, logits.shape[-1], logits.device, reuse, ahead)
        self.last_sampling = (key, tensors)
        return tensors

    def _step_batch(self, seqs, is_prefill, ids, embeds, positions, query_lens, sample_index, ahead_ids=None) -> StepBatch:
        wants_tokens = "sample" in self.hooks or "post_prefill" in self.hooks or "post_decode" in self.hooks
        sampled = [seqs[b] for b in sample_index]
        ahead = int(ahead_ids is not None)
        return StepBatch(
            is_prefill=is_prefill,
            request_ids=[s.request_id for s in seqs],
            extras=[s.extras for s in seqs],
            query_lens=query_lens,
            input_ids=ids,
            input_embeds=embeds,
            positions=positions,
            sample_index=sample_index,
            num_output_tokens=[s.num_output_tokens + ahead for s in sampled],
            past_tokens=[(s.token_ids if s.cacheable else s.output_token_ids) for s in sampled] if wants_tokens else [],
            ahead_tokens=ahead_ids,
        )

    def _per_sequence_outputs(self, seqs, batch, captured, query_lens, sample_index) -> dict[int, dict[str, Any]]:
        out: dict[int, dict[str, Any]] = {}
        if captured:
            offset = 0
            for b, seq in enumerate(seqs):
                n = query_lens[b]
                layers = seq.capture_layers(batch.is_prefill)
                if layers:
                    out.setdefault(b, {})["hidden_states"] = {layer: captured[layer][offset : offset + n] for layer in layers if layer in captured}
                offset += n
        for name, tensor in batch.step_outputs.items():
            for row, b in enumerate(sample_index):
                out.setdefault(b, {})[name] = tensor[row]
        return out

    # ---- CUDA graphs for decode ----------------------------------------------------------------

    def _graph_key(self, batch_size: int, width: int) -> tuple[int, int] | None:
        for key in sorted(self.graphs):
            if key[0] >= batch_size and key[1] >= width:
                return key
        return None

    def _static_inputs(self, size: int, width: int) -> dict[str, Any]:
        """A graph's inputs. The integer ones are views of one buffer (``index``: token ids,
        positions, slots, context lengths, the row of ``host_tokens`` the argmax writes, then the
        block-table rows) that a step fills with one copy from one of its two pinned host twins
        (``host_index``); the ids come first, so a step whose ids are already in place copies the
        rest."""
        dev, hidden = self.device, self.model.hidden_size
        index = torch.zeros(4 * size + 1 + size * width, dtype=torch.int64, device=dev)
        ids, positions, slots, context_lens = index[: 4 * size].view(4, size).unbind(0)
        slots.fill_(self.scratch_slot)
        context_lens.fill_(1)
        # the fused argmax also stores the tokens in pinned host memory: a step reads them there
        # instead of copying them (5-6 us a batch-1 overlapped step on the H200)
        extra = {"host_tokens": torch.zeros(2, size, dtype=torch.int64, pin_memory=True)} if self.fused_ops else {}
        return {
            **extra,
            "turn": index[4 * size : 4 * size + 1],
            "embeds": torch.zeros(size, hidden, dtype=self.dtype, device=dev),
            "index": index,
            "host_index": [torch.zeros(index.shape, dtype=torch.int64, pin_memory=True) for _ in range(2)],
            "host_turn": 0,
            "positions": positions,
            "slots": slots,
            "context_lens": context_lens,
            "ids": ids,
            "block_tables": index[4 * size + 1 :].view(size, width),
            "query_lens": torch.ones(size, dtype=torch.int64, device=dev),
        }

    def _prepare_graph_decode(self, seqs: list[Sequence], key: tuple[int, int], ahead_ids: torch.Tensor | None = None):
        """``_prepare`` for a decode step that replays the graph ``key``: the step's integers go
        straight into the graph's input buffer, padding rows included, in one host-to-device copy."""
        _, st = self.graphs[key]
        size, width = key
        n, bs = len(seqs), self.block_size
        pad = size - n
        ids, positions, slots, context_lens = self._decode_rows(seqs, ahead_ids is not None)
        rope = [p + s.rope_delta for s, p in zip(seqs, positions, strict=True)]  # the graph's positions are the model's
        # two host buffers, taken in turn: a step launched ahead fills one while the copy from
        # the other may still be queued behind the step before it
        turn = st["host_turn"]
        host = st["host_index"][turn]
        st["host_turn"] ^= 1
        # padding rows: token 0, position 0, the scratch slot, context 1
        host[: 4 * size + 1] = torch.tensor(ids + [0] * pad + rope + [0] * pad + slots + [self.scratch_slot] * pad + context_lens + [1] * pad + [turn])
        # block-table entries past a row's length are never read (nor a padding row's past its
        # first): they may keep earlier steps' block ids, so only the used part is written
        used = max(len(s.block_table) for s in seqs)
        tables = host[4 * size + 1 :].view(size, width)
        tables[:n, :used] = torch.tensor([s.block_table + [0] * (used - len(s.block_table)) for s in seqs])
        # one copy; the step's token sync orders the reuse of this host buffer two steps on. A
        # step launched ahead of this graph's previous replay, on the same sequences and taking
        # its argmax: that replay's argmax kernel wrote them into the ids already
        end = 4 * size + 1 + n * width
        reused = self.argmax_feeds_ids and ahead_ids is not None and ahead_ids.data_ptr() == st["greedy"].data_ptr()
        start = size if reused else 0
        st["index"][start:end].copy_(host[start:end], non_blocking=True)
        if reused:
            self.ids_reused += 1
        elif ahead_ids is not None:
            st["ids"][:n].copy_(ahead_ids)
        meta = AttentionMetadata(
            slot_mapping=st["slots"][:n],
            block_tables=st["block_tables"][:n],
            context_lens=st["context_lens"][:n],
            query_lens=st["query_lens"][:n],
            max_query_len=1,
            block_size=bs,
        )
        meta.host_query_lens, meta.host_context_lens = [1] * n, context_lens
        ids_t = st["ids"][:n]
        # in-graph lookup: the view is filled when the graph replays (no hook reads it before)
        embeds = st["embeds"][:n] if self.embed_in_graph else self.model.embed(ids_t)
        # hooks see cache positions, which differ from the graph's where a sequence has a rope offset
        # (a copy only where a hook can read them)
        hooks_need_own = rope != positions and self.hooks
        index_positions = to_device(torch.tensor(positions), self.device) if hooks_need_own else st["positions"][:n]
        return ids_t, index_positions, embeds, meta, [1] * n

    @torch.inference_mode()
    def _capture_graphs(self, sizes: list[int], widths: list[int]) -> None:
        pool = None
        shapes = sorted(((s, w) for s in sizes for w in widths), reverse=True)
        for size, width in progress.each(shapes, "capturing decode graphs (batch sizes x KV widths)"):
            st = self._static_inputs(size, width)
            meta = AttentionMetadata(st["slots"], st["block_tables"], st["context_lens"], st["query_lens"], 1, self.block_size)
            ctx = ForwardContext(meta, self.backend, self.kv_caches, False)

            def step(meta=meta, st=st, ctx=ctx):  # bound now: captured within this iteration
                self.backend.prepare(meta)
                embeds = self.model.embed(st["ids"]) if self.embed_in_graph else st["embeds"]
                hidden = self.model(embeds, st["positions"], ctx)
                logits = self.model.compute_logits(hidden)
                # the fused backend's argmax kernel: torch's reduction cost 4x more at these sizes
                if self.fused_ops:
                    greedy = kernels.argmax(logits, copy_to=st["ids"] if self.argmax_feeds_ids else None, host_out=st.get("host_tokens"), turn=st["turn"])
                else:
                    greedy = logits.argmax(dim=-1)
                return embeds, hidden, logits, greedy

            graph, (st["embeds"], st["hidden"], st["logits"], st["greedy"]) = capture_cuda_graph(step, self.device, pool)
            pool = graph.pool()
            self.graphs[(size, width)] = (graph, st)
        self.platform.synchronize(self.device)

    def _replay(self, key: tuple[int, int], embeds, batch_size: int):
        """Replays graph ``key`` (its integer inputs were filled by ``_prepare_graph_decode``);
        returns the rows' hidden states, logits and argmax tokens."""
        graph, st = self.graphs[key]
        n = batch_size
        if not self.embed_in_graph:
            st["embeds"][:n].copy_(embeds)
        graph.replay()
        return st["hidden"][:n], st["logits"][:n], st["greedy"][:n]
