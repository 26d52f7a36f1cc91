"""Fused element-wise steps of a decoder layer on the host through ``host_ops.c`` (float32):
residual add + RMSNorm, SiLU gate, rotary + paged cache write. Each replaces several torch ops,
whose fixed cost dominates at the row counts of a decode step."""

from __future__ import annotations

import ctypes
import functools
from types import SimpleNamespace

import torch

from omni_core.models import native


@functools.cache
def _library():
    """The bound functions of ``host_ops.c`` (``native.function``), or None where it cannot be built."""
    pointer, integer, real = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    signatures = {
        "add_rms_norm_f32": [pointer, pointer, pointer, real, integer, integer, pointer, pointer],
        "silu_mul_f32": [pointer, integer, integer, pointer],
        "rotary_store_f32": [pointer, integer] * 3 + [pointer, pointer, pointer] + [integer] * 4 + [pointer] * 4,
        "argmax_rows_f32": [pointer, integer, integer, pointer],
    }
    functions = {symbol: native.function("host_ops", symbol, argtypes) for symbol, argtypes in signatures.items()}
    return None if None in functions.values() else SimpleNamespace(**functions)


# torch's element-wise CPU ops use more than one thread only above this many elements
# (at::internal::GRAIN_SIZE): below it one thread on a kernel replaces several one-thread ops
PARALLEL_GRAIN = 32768


def takes(*tensors: torch.Tensor) -> bool:
    """Float32 host tensors, the library built, and either a first tensor smaller than torch's
    parallel grain or few intra-op threads (``native.MAX_INTRA_OP_THREADS``)."""
    for t in tensors:  # a plain loop: asked a dozen times a step, a generator cost more than the check
        if t.dtype != torch.float32 or t.device.type != "cpu":
            return False
    if _library() is None:
        return False
    return tensors[0].numel() < PARALLEL_GRAIN or torch.get_num_threads() <= native.MAX_INTRA_OP_THREADS


def add_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """``weight * rms_normalised(x)``; with ``residual``, ``(that of x + residual, x + residual)``."""
    hidden = x.shape[-1]
    x = x.contiguous()
    rows = x.numel() // hidden
    out = torch.empty_like(x)
    if residual is None:
        _library().add_rms_norm_f32(x.data_ptr(), None, weight.data_ptr(), eps, rows, hidden, out.data_ptr(), None)
        return out
    residual = residual.contiguous()
    total = torch.empty_like(x)
    _library().add_rms_norm_f32(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), eps, rows, hidden, out.data_ptr(), total.data_ptr())
    return out, total


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[rows, 2 * inter] (gate, then up) -> silu(gate) * up."""
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], inter)
    _library().silu_mul_f32(gate_up.data_ptr(), gate_up.numel() // (2 * inter), inter, out.data_ptr())
    return out


def rotary_store(q, k, v, rope, slots, k_cache, v_cache) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, heads, d] and k, v [T, kv_heads, d] (each token's heads contiguous, rows strided as
    column slices of one projection are), ``rope`` the tokens' (cos, sin) rows: the rotated q and k
    (new contiguous tensors), with k and v written into the caches at ``slots``. Bit for bit
    ``layers.apply_rotary`` and ``attention.store_kv``."""
    tokens, heads, dim = q.shape
    kv_heads = k.shape[1]
    cos, sin = (t.contiguous() for t in rope)
    slots = slots.to(torch.int64).contiguous()
    q_out = q.new_empty(tokens, heads, dim)
    k_out = k.new_empty(tokens, kv_heads, dim)
    _library().rotary_store_f32(
        q.data_ptr(), q.stride(0), k.data_ptr(), k.stride(0), v.data_ptr(), v.stride(0), cos.data_ptr(), sin.data_ptr(), slots.data_ptr(),
        tokens, heads, kv_heads, dim, q_out.data_ptr(), k_out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
    )
    return q_out, k_out


def argmax_rows(values: torch.Tensor) -> torch.Tensor:
    """[rows, cols] -> each row's index of its first largest value (int64), as ``argmax(dim=-1)``
    for values without NaN. Needs ``takes(values)``."""
    values = values.contiguous()
    out = torch.empty(values.shape[0], dtype=torch.int64)
    _library().argmax_rows_f32(values.data_ptr(), values.shape[0], values.shape[1], out.data_ptr())
    return out


def takes_rotary(q, k, v, rope, k_cache, v_cache) -> bool:
    """Host float32 tensors whose heads lie contiguous in each token's row, one (cos, sin) row of
    the head size per token, contiguous caches."""
    heads_packed = all(t.stride(2) == 1 and t.stride(1) == t.shape[2] for t in (q, k, v))
    rows = all(t.numel() == q.shape[0] * q.shape[2] for t in rope)
    return heads_packed and rows and k_cache.is_contiguous() and v_cache.is_contiguous() and takes(q, k, v, *rope, k_cache, v_cache)
