"""Mixture-of-experts layers on the host through the C kernel in ``moe.c`` (float32, every
expert's weights packed once)."""

from __future__ import annotations

import ctypes
import functools

import torch

from omni_core.models import native
from omni_core.models.native.linear import PANEL


@functools.cache
def _functions():
    """(pack, run) from ``moe.c``, or None where it cannot be built."""
    p, i = ctypes.c_void_p, ctypes.c_int64
    pack = native.function("moe", "pack_experts_f32", [p, p, i, i, i, p, p])
    run = native.function("moe", "moe_f32", [p, i, i, p, p, i, p, p, i, i, p], ctypes.c_int)
    return None if pack is None or run is None else (pack, run)


def preferred() -> bool:
    """Built, and few enough intra-op threads that the one-thread kernel beats torch's matmuls."""
    return native.preferred("moe") and _functions() is not None


def pack(gate_up: torch.Tensor, down: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stacked expert weights (gate/up [E, 2I, H], down [E, H, I]) in the kernel's panels."""
    experts, two_inter, hidden = gate_up.shape
    inter = two_inter // 2
    gate_up_packed = torch.empty(experts, -(-two_inter // PANEL), hidden, PANEL)
    down_packed = torch.empty(experts, -(-hidden // PANEL), inter, PANEL)
    gate_up, down = gate_up.detach().contiguous(), down.detach().contiguous()
    _functions()[0](gate_up.data_ptr(), down.data_ptr(), experts, hidden, inter, gate_up_packed.data_ptr(), down_packed.data_ptr())
    return gate_up_packed, down_packed


def experts(x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, gate_up_packed: torch.Tensor, down_packed: torch.Tensor,
            inter: int) -> torch.Tensor:
    """sum over a token's experts of weight * down(silu(gate(x)) * up(x)); x [T, H] float32 on the host."""
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise TypeError(f"the host experts kernel takes float32 CPU inputs, not {x.dtype} on {x.device}")
    tokens, hidden = x.shape
    top_k = ids.shape[1]
    x = x.contiguous()
    ids = ids.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    out = torch.empty(tokens, hidden)
    status = _functions()[1](x.data_ptr(), tokens, hidden, ids.data_ptr(), weights.data_ptr(), top_k, gate_up_packed.data_ptr(),
                             down_packed.data_ptr(), gate_up_packed.shape[0], inter, out.data_ptr())
    if status == -1:
        raise ValueError(f"expert ids must be in [0, {gate_up_packed.shape[0]})")
    if status:
        raise MemoryError("the host experts kernel could not allocate its scratch")
    return out
