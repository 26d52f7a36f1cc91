"""Decode attention for many sequences at once on the host: sequences grouped by context length.

At decode shapes (one query per sequence, a few hundred cached tokens) one SDPA call per
sequence is mostly dispatch cost, while one padded batch over the whole step computes and copies
the padding of every short sequence up to the longest one. Sorting the step's sequences by
context length and padding within small groups gets both few calls and little padding. K/V are
gathered whole blocks at a time (contiguous rows of ``block_size`` tokens) into one buffer per
step that every layer and group reuses, so a layer allocates no large tensors.

``plan_decode_groups`` runs once per step (``AttentionBackend.prepare``); ``grouped_decode``
once per layer, after the step's K/V were written to the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

DEFAULT_GROUP_SIZE = 8  # sequences per SDPA call: groups of 4 and of 16 were slower on 32-sequence decode steps


@dataclass
class DecodeGroup:
    rows: torch.Tensor  # [n] batch rows of the group's sequences
    start: int  # the group's first row in the sorted batch
    blocks: torch.Tensor  # [n * width] block ids, row after row
    size: int  # n
    length: int  # width * block_size: the gathered positions per sequence
    longest: int  # the longest context of the group: later positions are never read
    mask: torch.Tensor | None  # [n, 1, 1, longest] True where a position is in the context; None if all are


@dataclass
class DecodePlan:
    groups: list[DecodeGroup]
    order: torch.Tensor | None  # output row b is row order[b] of the grouped result; None: the batch was sorted
    block_size: int
    max_group_blocks: int
    buffers: tuple[torch.Tensor, torch.Tensor] | None = None  # K/V scratch, made by the step's first layer


def plan_decode_groups(block_tables: torch.Tensor, context_lens: list[int], block_size: int, group_size: int = DEFAULT_GROUP_SIZE) -> DecodePlan:
    """Groups of at most ``group_size`` sequences of similar context length, longest last."""
    device = block_tables.device
    order = sorted(range(len(context_lens)), key=context_lens.__getitem__)
    groups = []
    for start in range(0, len(order), group_size):
        rows = order[start : start + group_size]
        lens = [context_lens[b] for b in rows]
        width = -(-max(lens) // block_size)
        length = width * block_size
        rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
        blocks = block_tables.index_select(0, rows_t)[:, :width].reshape(-1)
        mask = None
        if min(lens) != max(lens):
            lens_t = torch.tensor(lens, dtype=torch.int64, device=device)
            mask = (torch.arange(max(lens), device=device)[None, :] < lens_t[:, None])[:, None, None, :]
        groups.append(DecodeGroup(rows_t, start, blocks, len(rows), length, max(lens), mask))
    inverse = None
    if order != sorted(order):
        inverse = torch.empty(len(order), dtype=torch.int64, device=device)
        inverse[torch.tensor(order, dtype=torch.int64, device=device)] = torch.arange(len(order), device=device)
    return DecodePlan(groups, inverse, block_size, max(g.blocks.numel() for g in groups))


def grouped_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan, scale: float) -> torch.Tensor:
    """q [B, heads, d] (one query per sequence) -> attention output [B, heads, d]."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    k_blocks = k_cache.view(-1, plan.block_size, kv_heads, dim)  # the cache holds whole blocks
    v_blocks = v_cache.view(-1, plan.block_size, kv_heads, dim)
    if plan.buffers is None:
        size = plan.max_group_blocks * plan.block_size * kv_heads * dim
        plan.buffers = (k_cache.new_empty(size), v_cache.new_empty(size))
    k_buffer, v_buffer = plan.buffers
    outs = []
    for g in plan.groups:
        shape = (g.blocks.numel(), plan.block_size, kv_heads, dim)
        n_el = g.size * g.length * kv_heads * dim
        keys = torch.index_select(k_blocks, 0, g.blocks, out=k_buffer[:n_el].view(shape))
        values = torch.index_select(v_blocks, 0, g.blocks, out=v_buffer[:n_el].view(shape))
        keys = keys.view(g.size, g.length, kv_heads, dim)[:, : g.longest].transpose(1, 2)
        values = values.view(g.size, g.length, kv_heads, dim)[:, : g.longest].transpose(1, 2)
        # grouped-query heads become query rows of their KV head: no repeated K/V
        queries = (q.narrow(0, g.start, g.size) if plan.order is None else q.index_select(0, g.rows)).view(g.size, kv_heads, heads // kv_heads, dim).to(keys.dtype)
        out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=g.mask, scale=scale)
        outs.append(out.reshape(g.size, heads, dim))
    grouped = outs[0] if len(outs) == 1 else torch.cat(outs)
    return grouped if plan.order is None else grouped.index_select(0, plan.order)
