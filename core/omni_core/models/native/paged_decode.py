"""Paged decode attention on the host through the C kernel in ``paged_decode.c``."""

from __future__ import annotations

import ctypes
import functools

import torch

from omni_core.models import native


@functools.cache
def _kernel():
    pointer, integer = ctypes.c_void_p, ctypes.c_int64
    return native.function("paged_decode", "paged_decode_attention_f32", [pointer] * 5 + [integer] * 6 + [ctypes.c_float, pointer, pointer])


def available() -> bool:
    return _kernel() is not None


def preferred() -> bool:
    """Built, and few enough intra-op threads (``native.preferred``); else the grouped SDPA path."""
    return native.preferred("paged_decode")


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """float32 on the host, contiguous caches, the heads a multiple of the KV heads."""
    float32 = q.device.type == "cpu" and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32
    return float32 and k_cache.is_contiguous() and v_cache.is_contiguous() and q.shape[1] % k_cache.shape[1] == 0


def paged_decode_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, longest: int, block_size: int, scale: float
) -> torch.Tensor:
    """q [B, heads, d] (one query per sequence), caches [slots, kv_heads, d], block_tables [B, width]
    and context_lens [B] (``longest`` their maximum) -> [B, heads, d]. Needs ``available()`` and
    ``supports(q, k_cache, v_cache)``."""
    batch, heads, dim = q.shape
    q = q.contiguous()
    block_tables = block_tables.to(torch.int64).contiguous()
    context_lens = context_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    scores = torch.empty(heads * max(longest, 1), dtype=torch.float32)
    _kernel()(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(),
        batch, heads, k_cache.shape[1], dim, block_tables.shape[1], block_size, scale, scores.data_ptr(), out.data_ptr(),
    )
    return out
