"""Paged causal prefill attention on the host through the C kernel in ``paged_prefill.c``."""

from __future__ import annotations

import ctypes
import functools

import torch

from omni_core.models import native

MAX_HEAD_DIM = 256  # the kernel's MAX_DIM
SCRATCH_FLOATS = 1 << 16  # a tile's scores (256 KiB): tiles shrink to fit long contexts


@functools.cache
def _kernel():
    pointer, integer = ctypes.c_void_p, ctypes.c_int64
    argtypes = [pointer] * 6 + [integer] * 6 + [ctypes.c_float, pointer, integer, pointer]
    return native.function("paged_prefill", "paged_prefill_attention_f32", argtypes, ctypes.c_int)


def preferred() -> bool:
    """Built, and few enough intra-op threads (``native.preferred``); else per-sequence SDPA."""
    return native.preferred("paged_prefill")


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """float32 on the host, contiguous caches, head size a multiple of 16 (up to 256), the heads a
    multiple of the KV heads."""
    float32 = q.device.type == "cpu" and q.dtype == k_cache.dtype == v_cache.dtype == torch.float32
    dim = q.shape[-1]
    shapes = dim % 16 == 0 and dim <= MAX_HEAD_DIM and q.shape[1] % k_cache.shape[1] == 0
    return float32 and shapes and k_cache.is_contiguous() and v_cache.is_contiguous()


def paged_prefill_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, query_lens: torch.Tensor,
    longest: int, block_size: int, scale: float,
) -> torch.Tensor:
    """q [T, heads, d] (the sequences' new tokens one after the other, their K/V already in the
    cache), caches [slots, kv_heads, d], block_tables [B, width], context_lens (``longest`` their
    maximum) and query_lens [B] -> [T, heads, d], each token attending causally to its sequence's
    positions up to its own. Needs the library built and ``supports(q, k_cache, v_cache)``."""
    tokens, heads, dim = q.shape
    q = q.contiguous()
    block_tables = block_tables.to(torch.int64).contiguous()
    context_lens = context_lens.to(torch.int64).contiguous()
    query_lens = query_lens.to(torch.int64).contiguous()
    out = torch.empty_like(q)
    scores = torch.empty(max(SCRATCH_FLOATS, heads // k_cache.shape[1] * (longest + 16)), dtype=torch.float32)
    status = _kernel()(
        q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), block_tables.data_ptr(), context_lens.data_ptr(), query_lens.data_ptr(),
        block_tables.shape[0], heads, k_cache.shape[1], dim, block_tables.shape[1], block_size, scale, scores.data_ptr(), scores.numel(), out.data_ptr(),
    )
    if status != 0:
        raise ValueError(f"paged prefill attention does not take head size {dim} with {heads} heads over {k_cache.shape[1]} KV heads")
    return out
