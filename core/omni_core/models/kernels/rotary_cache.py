"""Rotary embedding of q and k (NeoX halves) and the paged-cache write of k and v, in one kernel.

One program per token: it rotates every query and key head of the token in place, then writes
the rotated key and the value at the token's cache slot.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(base_ptr, stride_head, cos, sin, num_heads, HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr,
                  cache_ptr, cache_offset, stride_cache_head, STORE: tl.constexpr):
    heads = tl.arange(0, HEADS_PAD)
    half = tl.arange(0, HALF_PAD)
    mask = (heads < num_heads)[:, None] & (half < HALF)[None, :]
    ptr = base_ptr + heads[:, None] * stride_head + half[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    y1 = x1 * cos[None, :] - x2 * sin[None, :]
    y2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(ptr, y1.to(base_ptr.dtype.element_ty), mask=mask)
    tl.store(ptr + HALF, y2.to(base_ptr.dtype.element_ty), mask=mask)
    if STORE:
        cache = cache_ptr + cache_offset + heads[:, None] * stride_cache_head + half[None, :]
        tl.store(cache, y1.to(cache_ptr.dtype.element_ty), mask=mask)
        tl.store(cache + HALF, y2.to(cache_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_store_kernel(
    q_ptr, k_ptr, v_ptr, cos_ptr, sin_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_rope,
    stride_cache_slot, stride_cache_head,
    num_heads, num_kv_heads,
    HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, HALF: tl.constexpr, HALF_PAD: tl.constexpr, DIM_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    half = tl.arange(0, HALF_PAD)
    cos = tl.load(cos_ptr + t * stride_rope + half, mask=half < HALF, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + t * stride_rope + half, mask=half < HALF, other=0.0).to(tl.float32)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    cache_offset = slot * stride_cache_slot
    _rotate_heads(q_ptr + t * stride_qt, stride_qh, cos, sin, num_heads, HEADS_PAD, HALF, HALF_PAD, k_cache_ptr, cache_offset, stride_cache_head, False)
    _rotate_heads(k_ptr + t * stride_kt, stride_kh, cos, sin, num_kv_heads, KV_HEADS_PAD, HALF, HALF_PAD, k_cache_ptr, cache_offset, stride_cache_head, True)
    heads = tl.arange(0, KV_HEADS_PAD)
    dims = tl.arange(0, DIM_PAD)
    mask = (heads < num_kv_heads)[:, None] & (dims < 2 * HALF)[None, :]
    v = tl.load(v_ptr + t * stride_vt + heads[:, None] * stride_vh + dims[None, :], mask=mask, other=0.0)
    tl.store(v_cache_ptr + cache_offset + heads[:, None] * stride_cache_head + dims[None, :], v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def _check_heads(name: str, t: torch.Tensor) -> None:
    if t.stride(2) != 1:
        raise ValueError(f"{name} must have unit stride along head_dim, got strides {t.stride()}")


def rotary_store_kv(q, k, v, cos, sin, k_cache, v_cache, slot_mapping) -> None:
    """q [T, H, D], k/v [T, KVH, D] (views with unit stride along D are fine: q and k are rotated in
    place); cos/sin [T, ..., D] rows for each token's position (the halves repeat, as in the
    reference table); caches [slots, KVH, D]; slot_mapping [T]."""
    T, heads, dim = q.shape
    kv_heads = k.shape[1]
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_heads(name, t)
    if T == 0:
        return
    cos2, sin2 = cos.reshape(T, dim), sin.reshape(T, dim)
    if cos2.stride(-1) != 1 or sin2.stride(-1) != 1 or cos2.stride(0) != sin2.stride(0):
        cos2, sin2 = cos2.contiguous(), sin2.contiguous()
    if k_cache.stride(2) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("k_cache and v_cache must share one layout with unit stride along head_dim")
    half = dim // 2
    _rotary_store_kernel[(T,)](
        q, k, v, cos2, sin2, k_cache, v_cache, slot_mapping,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), cos2.stride(0),
        k_cache.stride(0), k_cache.stride(1),
        heads, kv_heads,
        HEADS_PAD=triton.next_power_of_2(heads), KV_HEADS_PAD=triton.next_power_of_2(kv_heads),
        HALF=half, HALF_PAD=triton.next_power_of_2(half), DIM_PAD=triton.next_power_of_2(dim),
    )
