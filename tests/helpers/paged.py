"""Paged KV caches for attention tests: each sequence's blocks scattered in a shuffled order, and
the attention they should give, by torch SDPA over each sequence's gathered K/V."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def scattered_cache(context_lens: list[int], kv_heads: int, dim: int, block_size: int, generator: torch.Generator, spare_blocks: int = 3):
    """(block_tables [B, widest], k_cache, v_cache [slots, kv_heads, dim]): the sequences' blocks
    drawn in a random order from a cache with ``spare_blocks`` more than they use; a table row
    past a sequence's blocks holds 0, as the engine pads it."""
    widths = [-(-n // block_size) for n in context_lens]
    ids = torch.randperm(sum(widths) + spare_blocks, generator=generator).tolist()
    tables, at = [], 0
    for w in widths:
        tables.append(ids[at : at + w] + [0] * (max(widths) - w))
        at += w
    slots = (sum(widths) + spare_blocks) * block_size
    k_cache = torch.randn(slots, kv_heads, dim, generator=generator)
    v_cache = torch.randn(slots, kv_heads, dim, generator=generator)
    return torch.tensor(tables), k_cache, v_cache


def reference_attention(q, k_cache, v_cache, tables, context_lens: list[int], query_lens: list[int], block_size: int, scale: float | None = None) -> torch.Tensor:
    """q [tokens, heads, dim], each sequence's ``query_lens[b]`` tokens (its last positions) one
    after the other, attending causally to its first ``context_lens[b]`` cached positions; SDPA's
    scale (1 / sqrt(dim)) unless given."""
    outs, start = [], 0
    for b, (ctx, n) in enumerate(zip(context_lens, query_lens, strict=True)):
        pos = torch.arange(ctx)
        slots = tables[b, pos // block_size] * block_size + pos % block_size
        keys, values = k_cache[slots].transpose(0, 1)[None], v_cache[slots].transpose(0, 1)[None]
        visible = pos[None, :] <= torch.arange(ctx - n, ctx)[:, None]
        out = F.scaled_dot_product_attention(q[start : start + n].transpose(0, 1)[None], keys, values, attn_mask=visible, scale=scale, enable_gqa=True)
        outs.append(out[0].transpose(0, 1))
        start += n
    return torch.cat(outs)
