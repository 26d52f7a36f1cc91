"""Paged self-attention: what a model layer calls, and the swappable backend behind it.

The KV cache of one layer is a pair of tensors ``[num_slots, num_kv_heads, head_dim]`` where
slot ``s`` is token ``s % block_size`` of block ``s // block_size``. A step's tokens are packed
(``[T, heads, head_dim]``, sequence after sequence); ``AttentionMetadata`` says where each new
token's KV goes (``slot_mapping``) and which blocks each sequence reads (``block_tables``).

A backend implements ``prepare(meta)`` (once per step: index tensors shared by all layers) and
``forward(q, k, v, k_cache, v_cache, meta, scale)``. ``SdpaBackend`` gathers each sequence's KV
into a padded batch and runs ``torch.nn.functional.scaled_dot_product_attention`` with a causal
mask built from lengths: the same code serves prefill, chunked prefill and decode, on CPU and in
CUDA graphs (its decode path has static shapes). A backend with ``fuses_rotary = True`` also takes
``rope=(cos, sin)`` and rotates q and k itself (with its cache write); one with ``fused_ops =
True`` asks the backbones for their fused norm and activation kernels (``TritonPagedBackend``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from omni_core.models.grouped_decode import grouped_decode, plan_decode_groups
from omni_core.models.kernels import varlen_prefill
from omni_core.models.layers import apply_rotary
from omni_core.models.native import host_ops, paged_decode, paged_prefill


@dataclass
class AttentionMetadata:
    """Describes one step's packed batch of ``B`` sequences and ``T`` new tokens.

    ``query_lens[b]`` new tokens of sequence ``b`` attend to its first ``context_lens[b]`` cache
    positions (earlier tokens plus themselves). ``max_query_len`` is a Python int (1 for decode).
    ``padded_index`` ([T], prefill only) is each packed token's row in the ``[B * max_query_len]``
    padded layout and ``packed_index`` ([B * max_query_len]) the packed row of each padded one;
    both None where the step's rows are that padded layout already (prefill graphs).
    """

    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, max_blocks] int64
    context_lens: torch.Tensor  # [B] int64
    query_lens: torch.Tensor  # [B] int64
    max_query_len: int
    block_size: int
    padded_index: torch.Tensor | None = None
    packed_index: torch.Tensor | None = None
    host_query_lens: list[int] | None = None  # the same lengths as Python ints (not in graphs)
    host_context_lens: list[int] | None = None
    cache: dict[str, Any] = field(default_factory=dict)  # backend scratch, built by prepare()


class AttentionBackend(Protocol):
    def prepare(self, meta: AttentionMetadata) -> None: ...

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor: ...


def store_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor) -> None:
    if k.dtype != k_cache.dtype:  # checked here: a no-op .to() still costs a dispatch per layer
        k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k_cache.index_copy_(0, slots, k)
    v_cache.index_copy_(0, slots, v)


class SdpaBackend:
    """torch SDPA over KV gathered from the paged cache (any device); on the host in float32, C
    kernels for decode and prefill attention and for rotary + cache write (``models/native``)."""

    name = "sdpa"
    fuses_rotary = True  # forward takes ``rope``: on the host kernel, rotary and cache write are one pass

    def __init__(self, per_sequence: bool | None = None, native: bool = True):
        # None: for prefill the host kernel on CPU, one varlen kernel for several prompts elsewhere,
        # else per sequence; for CPU decode the host kernel or grouped by length;
        # padded batch for CUDA decode
        self.per_sequence = per_sequence
        self.native = native  # CPU float32 decode and prefill on the host C kernels where preferred (models/native)

    def prepare(self, meta: AttentionMetadata) -> None:
        if self.per_sequence is None and meta.host_context_lens is not None and meta.max_query_len == 1 and meta.block_tables.device.type == "cpu":
            # CPU decode by default: the C kernel reading the paged cache (float32, few intra-op
            # threads), else sequences grouped by context length (see grouped_decode)
            if self.native and paged_decode.preferred():
                meta.cache["native_decode"] = max(meta.host_context_lens)
            else:
                meta.cache["decode_plan"] = plan_decode_groups(meta.block_tables, meta.host_context_lens, meta.block_size)
            return
        if self._per_sequence(meta):
            on_host = meta.block_tables.device.type == "cpu"
            if self.per_sequence is None and self.native and on_host and paged_prefill.preferred():
                meta.cache["native_prefill"] = max(meta.host_context_lens)  # CPU prefill by default: the C kernel reading the paged cache
            elif self.per_sequence is None and not on_host and len(meta.host_query_lens) > 1:
                # several prompts on an accelerator: one varlen kernel a layer, not one call a prompt
                meta.cache["varlen"] = varlen_prefill.plan(meta)
            else:
                meta.cache["seq_slots"] = self._sequence_slots(meta)
            return
        bt = meta.block_tables
        bs = meta.block_size
        device = bt.device
        max_kv = bt.shape[1] * bs
        pos = torch.arange(max_kv, device=device)
        kv_slots = bt[:, pos // bs] * bs + pos % bs  # [B, max_kv]
        q_pos = torch.arange(meta.max_query_len, device=device)
        # query i of sequence b sits at cache position context_len - query_len + i
        first_q = (meta.context_lens - meta.query_lens)[:, None]
        allowed = pos[None, None, :] <= (first_q + q_pos[None, :])[:, :, None]  # [B, Q, K]
        allowed &= pos[None, None, :] < meta.context_lens[:, None, None]
        allowed[:, :, 0] = True  # padded query rows must see something; their output is dropped
        meta.cache["kv_slots"] = kv_slots
        meta.cache["mask"] = allowed[:, None]  # [B, 1, Q, K]

    @staticmethod
    def _sequence_slots(meta: AttentionMetadata) -> list[torch.Tensor | None]:
        """Each sequence's cache slots, None for one without history (it attends to its fresh K/V)."""
        bs = meta.block_size
        seq_slots = []
        for b, (n, ctx) in enumerate(zip(meta.host_query_lens, meta.host_context_lens, strict=True)):
            if ctx == n:
                seq_slots.append(None)
            else:
                pos = torch.arange(ctx, device=meta.block_tables.device)
                seq_slots.append(meta.block_tables[b, pos // bs] * bs + pos % bs)
        return seq_slots

    def _per_sequence(self, meta: AttentionMetadata) -> bool:
        """Sequence by sequence when lengths are known on the host (not in a graph): by default
        for prefill anywhere (decode on CPU is grouped by length before this is asked, and decode
        elsewhere runs one padded batch)."""
        if meta.host_query_lens is None:
            return False
        if self.per_sequence is not None:
            return self.per_sequence
        return meta.max_query_len > 1

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, rope=None):
        if rope is not None:
            if host_ops.takes_rotary(q, k, v, rope, k_cache, v_cache):
                q, k = host_ops.rotary_store(q, k, v, rope, meta.slot_mapping, k_cache, v_cache)
                return self.attend(q, k, v, k_cache, v_cache, meta, scale)
            q, k = apply_rotary(q, k, rope)
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return self.attend(q, k, v, k_cache, v_cache, meta, scale)

    def attend(self, q, k, v, k_cache, v_cache, meta, scale):
        """Attention once the step's K/V are in the cache (``prepare(meta)`` ran for this step)."""
        if "native_decode" in meta.cache:
            if paged_decode.supports(q, k_cache, v_cache):
                return paged_decode.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.cache["native_decode"], meta.block_size, scale)
            if "decode_plan" not in meta.cache:  # a cache the kernel does not take: the grouped path
                meta.cache["decode_plan"] = plan_decode_groups(meta.block_tables, meta.host_context_lens, meta.block_size)
        if "decode_plan" in meta.cache:
            out = grouped_decode(q, k_cache, v_cache, meta.cache["decode_plan"], scale)
            return out if out.dtype == q.dtype else out.to(q.dtype)
        if "native_prefill" in meta.cache:
            if paged_prefill.supports(q, k_cache, v_cache):
                return paged_prefill.paged_prefill_attention(
                    q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.query_lens, meta.cache["native_prefill"], meta.block_size, scale
                )
            if "seq_slots" not in meta.cache:  # shapes or a cache the kernel does not take: SDPA per sequence
                meta.cache["seq_slots"] = self._sequence_slots(meta)
        if "varlen" in meta.cache:
            if varlen_prefill.supports(q, k_cache):
                return varlen_prefill.attend(q, k_cache, v_cache, meta.cache["varlen"], scale)
            if "seq_slots" not in meta.cache:  # a dtype or head size the kernel does not take: SDPA per sequence
                meta.cache["seq_slots"] = self._sequence_slots(meta)
        if "seq_slots" in meta.cache:
            return self._forward_per_sequence(q, k, v, k_cache, v_cache, meta, scale)
        kv_slots = meta.cache["kv_slots"]
        B, max_kv = kv_slots.shape
        Q = meta.max_query_len
        heads, dim = q.shape[1], q.shape[2]
        kv_heads = k_cache.shape[1]
        group = heads // kv_heads
        keys = k_cache[kv_slots.reshape(-1)].view(B, max_kv, kv_heads, dim).transpose(1, 2)
        values = v_cache[kv_slots.reshape(-1)].view(B, max_kv, kv_heads, dim).transpose(1, 2)
        queries = q.view(B, 1, heads, dim) if Q == 1 else (q if meta.packed_index is None else q[meta.packed_index]).view(B, Q, heads, dim)
        # grouped-query attention without repeating K/V: the query heads sharing a KV head
        # become extra query rows (q head h uses KV head h // group)
        queries = queries.view(B, Q, kv_heads, group, dim).permute(0, 2, 3, 1, 4).reshape(B, kv_heads, group * Q, dim)
        mask = meta.cache["mask"]
        if group > 1:
            mask = mask.expand(B, group, Q, max_kv).reshape(B, 1, group * Q, max_kv) if Q > 1 else mask
        out = F.scaled_dot_product_attention(queries.to(keys.dtype), keys, values, attn_mask=mask, scale=scale)
        out = out.view(B, kv_heads, group, Q, dim).permute(0, 3, 1, 2, 4).reshape(B * Q, heads, dim)
        if Q == 1 or meta.padded_index is None:
            return out.to(q.dtype)
        return out[meta.padded_index].to(q.dtype)

    def _forward_per_sequence(self, q, k, v, k_cache, v_cache, meta, scale):
        """One SDPA call per sequence: without history, the fresh K/V with ``is_causal`` (the
        fused kernels' fast path, no mask); with history (cached prefix, later chunk, decode),
        its slots gathered from the cache, masked causally only when several queries need it."""
        outs = []
        start = 0
        for n, ctx, slots in zip(meta.host_query_lens, meta.host_context_lens, meta.cache["seq_slots"], strict=True):
            qb = q[start : start + n].transpose(0, 1)[None]  # [1, heads, n, d]
            mask = None
            if slots is None:
                kb, vb = k[start : start + n], v[start : start + n]
            else:
                kb, vb = k_cache[slots], v_cache[slots]
                if n > 1:
                    pos = torch.arange(ctx, device=q.device)
                    mask = pos[None, :] <= torch.arange(ctx - n, ctx, device=q.device)[:, None]
            kb = kb.transpose(0, 1)[None].to(qb.dtype)
            vb = vb.transpose(0, 1)[None].to(qb.dtype)
            causal = slots is None and n > 1
            out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=kb.shape[1] != qb.shape[1])
            outs.append(out[0].transpose(0, 1))
            start += n
        return torch.cat(outs)


class ForwardContext:
    """What a model's forward sees of the engine during one step.

    ``attention(layer, q, k, v)`` runs paged self-attention for decoder layer ``layer`` (q: [T,
    heads, dim], k/v: [T, kv_heads, dim]). ``extras`` lists the per-request ``extras`` dicts of
    the batch's sequences in batch order (a family keeps, e.g., cross-attention K/V there);
    ``query_lens`` (a Python list) says how many packed tokens each sequence has this step.
    ``capture(index, hidden)`` records hidden states for requests that asked for that layer
    (index 0: input embeddings, i: output of decoder layer i, counting from 1). ``fused_ops``
    says whether the backend wants the backbones' fused kernels (norms, activations), and
    ``fused_decode_rows`` whether this step's layers run its fused projection kernels.
    """

    def __init__(
        self,
        meta: AttentionMetadata,
        backend: AttentionBackend,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        is_prefill: bool,
        extras: list[dict[str, Any]] | None = None,
        query_lens: list[int] | None = None,
        capture_layers: frozenset[int] = frozenset(),
    ):
        self.meta = meta
        self.backend = backend
        self.kv_caches = kv_caches
        self.is_prefill = is_prefill
        self.extras = extras or []
        self.query_lens = query_lens or []
        self.capture_layers = capture_layers
        self.captured: dict[int, torch.Tensor] = {}
        self.fused_ops = bool(getattr(backend, "fused_ops", False))
        # decided once per step, read by every layer: whether the backend's fused decode-row kernels run
        fuses_rows = getattr(backend, "fuses_decode_rows", None)
        self.fused_decode_rows = self.fused_ops and fuses_rows is not None and fuses_rows(meta)

    def attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float | None = None, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """``rope`` (each token's cos and sin rows, see ``RotaryEmbedding.table``) rotates q and k
        first; a backend that fuses the rotation with its cache write does it."""
        k_cache, v_cache = self.kv_caches[layer]
        if scale is None:
            scale = q.shape[-1] ** -0.5
        if rope is not None:
            if getattr(self.backend, "fuses_rotary", False):
                return self.backend.forward(q, k, v, k_cache, v_cache, self.meta, scale, rope=rope)
            q, k = apply_rotary(q, k, rope)
        return self.backend.forward(q, k, v, k_cache, v_cache, self.meta, scale)

    def capture(self, index: int, hidden: torch.Tensor) -> None:
        if index in self.capture_layers:
            self.captured[index] = hidden
