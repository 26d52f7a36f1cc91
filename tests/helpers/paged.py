"""Paged KV caches for attention tests: each sequence's blocks scattered in a shuffled order."""

from __future__ import annotations

import torch


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
