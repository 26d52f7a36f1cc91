"""Prefill attention of several sequences in one flash-attention call (torch's ``varlen_attn``).

A step that prefills many prompts at once (a burst of requests) would otherwise run one SDPA call
per prompt per layer: launch-bound on a GPU (31 prompts x 48 layers = 1,488 calls). Here every
sequence's queries stay packed ``[T, heads, d]``, its keys and values are gathered from the paged
cache into one packed ``[sum(context), kv_heads, d]`` tensor, and one kernel attends each query to
its own sequence's keys, causally aligned to the end of the sequence (a later chunk of a prompt
sees the cached start of it). CUDA half precision only: elsewhere the caller keeps its
per-sequence path.
"""

from __future__ import annotations

import functools
import inspect

import torch


@functools.cache
def _varlen_attn():
    """torch's varlen_attn and the keyword it takes for causal masking, or None where absent."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:  # newer torch: causal is the window (-1, 0)
        causal = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal = {"is_causal": True}
    else:
        return None
    return varlen_attn, causal, "enable_gqa" in params


def supports(q: torch.Tensor, cache: torch.Tensor) -> bool:
    """Whether one varlen call can serve this step's queries over this cache."""
    return (
        q.is_cuda
        and q.dtype in (torch.float16, torch.bfloat16)
        and q.shape[-1] % 8 == 0
        and q.shape[-1] <= 256
        and cache.shape[1] > 0
        and q.shape[1] % cache.shape[1] == 0
        and _varlen_attn() is not None
    )


def plan(meta) -> dict:
    """Index tensors shared by every layer of the step (``meta``: its AttentionMetadata), made on
    the device from the lengths the step already moved there: cumulative query and key offsets and
    the cache slot of each packed key (sequence after sequence, positions 0..context-1)."""
    contexts, device = meta.context_lens, meta.block_tables.device
    total_k = sum(meta.host_context_lens)
    zero = contexts.new_zeros(1)
    ends_k = torch.cat([zero, torch.cumsum(contexts, 0)])
    rows = torch.arange(len(contexts), device=device)
    seq = torch.repeat_interleave(rows, contexts, output_size=total_k)
    pos = torch.arange(total_k, device=device) - ends_k[seq]
    slots = meta.block_tables[seq, pos // meta.block_size] * meta.block_size + pos % meta.block_size
    cu_q = torch.cat([zero, torch.cumsum(meta.query_lens, 0)]).to(torch.int32)
    return {
        "slots": slots, "cu_q": cu_q, "cu_k": ends_k.to(torch.int32),
        "max_q": meta.max_query_len, "max_k": max(meta.host_context_lens),
    }  # fmt: skip


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, planned: dict, scale: float):
    """Packed queries [T, heads, d] over their sequences' cached keys -> [T, heads, d]."""
    varlen_attn, causal, takes_gqa = _varlen_attn()
    keys = k_cache[planned["slots"]].to(q.dtype)
    values = v_cache[planned["slots"]].to(q.dtype)
    extra = dict(causal)
    if takes_gqa and keys.shape[1] != q.shape[1]:
        extra["enable_gqa"] = True
    offsets = (planned["cu_q"], planned["cu_k"], planned["max_q"], planned["max_k"])
    return varlen_attn(q.contiguous(), keys, values, *offsets, scale=scale, **extra)
