"""Decode attention for many sequences at once on the host: sequences grouped by context length.

At decode shapes (one query per sequence, a few hundred cached tokens) one SDPA call per
sequence is mostly dispatch cost, while one padded batch over the whole step computes and copies
the padding of every short sequence up to the longest one. Sorting the step's sequences by
context length and padding within small groups gets both few calls and little padding. K/V are
gathered whole blocks at a time (contiguous rows of ``block_size`` tokens) into one buffer per
step that every layer and group reuses, so a layer allocates no large tensors. SDPA reads the
gathered K/V in place (a transposed view: its CPU kernel takes strided inputs without copying).

``plan_decode_groups`` runs once per step (``AttentionBackend.prepare``); ``grouped_decode``
once per layer, after the step's K/V were written to the cache. Everything a layer would
otherwise redo is made once per step: the block ids of each group, the queries' sorted order and
the padding masks, kept additive (0 / -inf) in the cache's dtype so that SDPA does not convert a
boolean mask on every call.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

DEFAULT_GROUP_SIZE = 8  # sequences per SDPA call: groups of 4, 6 and 12 were no faster on 8-32-sequence decode steps


@dataclass
class DecodeGroup:
    start: int  # the group's first row in the sorted batch
    size: int  # n sequences
    blocks: torch.Tensor  # [n * width] block ids, row after row
    length: int  # width * block_size: the gathered positions per sequence
    longest: int  # the longest context of the group: later positions are never read
    padded: bool  # some of its sequences are shorter than the longest


@dataclass
class DecodePlan:
    groups: list[DecodeGroup]
    order: torch.Tensor | None  # sorted row i is batch row order[i]; None: the batch was sorted
    inverse: torch.Tensor | None  # batch row b is sorted row inverse[b]
    block_size: int
    max_group_blocks: int
    padding: torch.Tensor  # [B, longest context] True past each sorted sequence's context
    # per group, made by the step's first layer: (K, V gather targets, the K, V views SDPA reads, additive mask)
    steps: list[tuple] = field(default_factory=list)


def plan_decode_groups(block_tables: torch.Tensor, context_lens: list[int], block_size: int, group_size: int = DEFAULT_GROUP_SIZE) -> DecodePlan:
    """Groups of at most ``group_size`` sequences of similar context length, longest last."""
    device = block_tables.device
    batch = len(context_lens)
    order = sorted(range(batch), key=context_lens.__getitem__)
    lens = [context_lens[b] for b in order]
    order_t = inverse = None
    if order != list(range(batch)):
        positions = [0] * batch
        for i, b in enumerate(order):
            positions[b] = i
        order_t = torch.tensor(order, dtype=torch.int64, device=device)
        inverse = torch.tensor(positions, dtype=torch.int64, device=device)
        block_tables = block_tables.index_select(0, order_t)
    # one padding mask for the whole sorted batch; a group reads its rows up to its longest context
    padding = torch.arange(lens[-1], device=device)[None, :] >= torch.tensor(lens, device=device)[:, None]
    groups = []
    for start in range(0, batch, group_size):
        size = min(group_size, batch - start)
        longest = lens[start + size - 1]
        width = -(-longest // block_size)
        blocks = block_tables[start : start + size, :width].reshape(-1)
        groups.append(DecodeGroup(start, size, blocks, width * block_size, longest, lens[start] != longest))
    return DecodePlan(groups, order_t, inverse, block_size, max(g.blocks.numel() for g in groups), padding)


def grouped_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan, scale: float) -> torch.Tensor:
    """q [B, heads, d] (one query per sequence) -> attention output [B, heads, d] in the cache's dtype."""
    batch, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    if not plan.steps:
        _prepare_layers(plan, k_cache, v_cache)
    k_blocks = k_cache.view(-1, plan.block_size, kv_heads, dim)  # the cache holds whole blocks
    v_blocks = v_cache.view(-1, plan.block_size, kv_heads, dim)
    # grouped-query heads become query rows of their KV head: no repeated K/V
    queries = q if plan.order is None else q.index_select(0, plan.order)
    queries = queries.reshape(batch, kv_heads, heads // kv_heads, dim)
    if queries.dtype != k_cache.dtype:
        queries = queries.to(k_cache.dtype)
    outs = []
    for g, (k_out, v_out, keys, values, mask) in zip(plan.groups, plan.steps, strict=True):
        torch.index_select(k_blocks, 0, g.blocks, out=k_out)
        torch.index_select(v_blocks, 0, g.blocks, out=v_out)
        outs.append(F.scaled_dot_product_attention(queries.narrow(0, g.start, g.size), keys, values, attn_mask=mask, scale=scale))
    grouped = (outs[0] if len(outs) == 1 else torch.cat(outs)).view(batch, heads, dim)
    return grouped if plan.inverse is None else grouped.index_select(0, plan.inverse)


def _prepare_layers(plan: DecodePlan, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """The step's first layer makes the gather buffers and, per group, the views every layer
    reuses: where its blocks are gathered, the [n, kv_heads, longest, d] K/V that SDPA reads
    from there, and its additive mask."""
    kv_heads, dim = k_cache.shape[1], k_cache.shape[2]
    size = plan.max_group_blocks * plan.block_size * kv_heads * dim
    k_buffer, v_buffer = k_cache.new_empty(size), v_cache.new_empty(size)
    # 0 where a position is read, -inf where it is padding
    additive = torch.zeros(plan.padding.shape, dtype=k_cache.dtype, device=k_cache.device).masked_fill_(plan.padding, float("-inf"))
    for g in plan.groups:
        n_el = g.size * g.length * kv_heads * dim
        k_out = k_buffer[:n_el].view(g.blocks.numel(), plan.block_size, kv_heads, dim)
        v_out = v_buffer[:n_el].view(g.blocks.numel(), plan.block_size, kv_heads, dim)
        keys = k_out.view(g.size, g.length, kv_heads, dim)[:, : g.longest].transpose(1, 2)
        values = v_out.view(g.size, g.length, kv_heads, dim)[:, : g.longest].transpose(1, 2)
        mask = additive[g.start : g.start + g.size, None, None, : g.longest] if g.padded else None
        plan.steps.append((k_out, v_out, keys, values, mask))
