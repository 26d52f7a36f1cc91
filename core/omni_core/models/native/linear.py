"""Linear layers on the host through the C kernel in ``linear.c`` (float32, weights packed once)."""

from __future__ import annotations

import ctypes
import functools

import torch

from omni_core.models import native

PANEL = 32  # output columns a packed panel holds (linear.c)


@functools.cache
def _functions():
    """(pack, multiply) from ``linear.c``, or None where it cannot be built."""
    pointer, integer = ctypes.c_void_p, ctypes.c_int64
    pack_fn = native.function("linear", "pack_linear_weight_f32", [pointer, integer, integer, pointer])
    multiply = native.function("linear", "linear_f32", [pointer, integer, integer, pointer, pointer, integer, pointer])
    return None if pack_fn is None or multiply is None else (pack_fn, multiply)


def available() -> bool:
    return _functions() is not None


def preferred() -> bool:
    """Built, and few enough intra-op threads (``native.preferred``): the kernel runs on one thread,
    where torch's matmuls would use them all (``cpu_linear.pack_cpu_linears`` then also times it)."""
    return native.preferred("linear")


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A float32 host weight [out, in] in the kernel's panels (a new tensor)."""
    out_features, in_features = weight.shape
    weight = weight.detach().contiguous()
    packed = torch.empty(-(-out_features // PANEL), in_features, PANEL, dtype=torch.float32)
    _functions()[0](weight.data_ptr(), out_features, in_features, packed.data_ptr())
    return packed


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """``x [rows, in] @ W^T (+ bias)`` for ``packed = pack(W)``; x float32 on the host."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise TypeError(f"the host linear kernel takes float32 CPU inputs, not {x.dtype} on {x.device}")
    x = x.contiguous()
    out = torch.empty(x.shape[0], out_features, dtype=torch.float32)
    _functions()[1](x.data_ptr(), x.shape[0], x.shape[1], packed.data_ptr(), None if bias is None else bias.data_ptr(), out_features, out.data_ptr())
    return out
