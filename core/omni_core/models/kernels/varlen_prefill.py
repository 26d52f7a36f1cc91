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


def plan(block_tables: torch.Tensor, block_size: int, query_lens: list[int], context_lens: list[int]) -> dict:
    """Index tensors shared by every layer of the step: cumulative query and key offsets and the
    cache slot of each packed key (sequence after sequence, positions 0..context-1)."""
    device = block_tables.device
    total_k = sum(context_lens)
    n = len(context_lens)
    # every integer the step needs goes over in one copy
    host = torch.tensor([[*context_lens, 0], *_offsets(query_lens, context_lens)], dtype=torch.int64)
    ints = _to(host, device)
    contexts, cu_q, cu_k = ints[0, :n], ints[1].to(torch.int32), ints[2].to(torch.int32)
    seq = torch.repeat_interleave(torch.arange(n, device=device), contexts, output_size=total_k)
    pos = torch.arange(total_k, device=device) - cu_k.long()[seq]
    slots = block_tables[seq, pos // block_size] * block_size + pos % block_size
    return {"slots": slots, "cu_q": cu_q, "cu_k": cu_k, "max_q": max(query_lens), "max_k": max(context_lens)}


def _offsets(query_lens: list[int], context_lens: list[int]) -> list[list[int]]:
    """Cumulative query and key offsets, n + 1 each."""
    cu_q, cu_k = [0], [0]
    for q, k in zip(query_lens, context_lens, strict=True):
        cu_q.append(cu_q[-1] + q)
        cu_k.append(cu_k[-1] + k)
    return [cu_q, cu_k]


def _to(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Through pinned memory without waiting: a copy from pageable memory would first wait for
    all the work queued on the GPU (other stages' steps)."""
    if device.type == "cpu":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def attend(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, planned: dict, scale: float) -> torch.Tensor:
    """Packed queries [T, heads, d] over their sequences' cached keys -> [T, heads, d]."""
    varlen_attn, causal, takes_gqa = _varlen_attn()
    keys = k_cache[planned["slots"]].to(q.dtype)
    values = v_cache[planned["slots"]].to(q.dtype)
    extra = dict(causal)
    if takes_gqa and keys.shape[1] != q.shape[1]:
        extra["enable_gqa"] = True
    return varlen_attn(
        q.contiguous(), keys, values, planned["cu_q"], planned["cu_k"], planned["max_q"], planned["max_k"], scale=scale, **extra
    )
