"""Linear layers on CPU with the weight pre-packed for oneDNN.

On the development CPU (AVX-512, one thread, float32) oneDNN's matmul on a weight reordered once
into its blocked layout ran the logits head (8192 x 256) 1.5x faster than ``F.linear`` at one row
and 1.9-2.6x at 8-32 rows, and the MLP's gate/up and down projections 1.3-1.8x at 8-32 rows
(1.1-1.25x at 512); q/k/v and o_proj gained nothing or lost (docs/benchmarks.md, AR engine, CPU).
So the logits heads (``PackedWeight``, beside the weight: a tied head's weight is also the
embedding) and the MLPs (``pack_mlp_weights``, in place of the weight) use it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def _onednn_linear() -> bool:
    """Whether this torch build has oneDNN's packed linear (asked once: every head call asks)."""
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packing_supported(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2 and _onednn_linear()


class PackedWeight:
    """``weight`` reordered for oneDNN, remade for another weight tensor or after an in-place
    write to it (a new load)."""

    def __init__(self):
        self._source = None  # the weight packed (held, so a new one cannot take its address)
        self._stamp = None
        self._packed = None

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x @ weight^T``: on the packed copy for x [N, K] and a weight ``packing_supported``
        takes (of x's dtype), else ``F.linear``."""
        if x.dim() != 2 or x.dtype != weight.dtype or not packing_supported(weight):
            return F.linear(x, weight)
        stamp = (weight.data_ptr(), _version(weight))  # new storage (a move, a reload) or an in-place write
        if weight is not self._source or stamp != self._stamp:
            self._packed = _reorder(weight)
            self._source, self._stamp = weight, stamp
        return _packed_matmul(x, self._packed, None)


def _reorder(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)


def _packed_matmul(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``x [N, K] @ W^T (+ bias)`` on a weight ``torch.ops.mkldnn._reorder_linear_weight`` packed."""
    return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, bias, "none", [], "")


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place write counter (a weight loaded in place changes it); inference-mode
    tensors have none and cannot be written outside inference mode: 0."""
    try:
        return t._version
    except RuntimeError:
        return 0


class PackedCpuLinear(nn.Module):
    """A float32 CPU ``nn.Linear`` whose weight is kept only in oneDNN's packed layout."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = _reorder(linear.weight)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = _packed_matmul(x.reshape(-1, self.in_features), self.packed, self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed for oneDNN"


def pack_mlp_weights(model: nn.Module) -> int:
    """Replaces the gate/up and down projections of each ``GatedMLP`` in ``model`` whose weights
    ``packing_supported`` by ``PackedCpuLinear`` (the unpacked weights are released: the model's
    memory stays the same, its ``state_dict`` no longer holds them). Returns how many MLPs."""
    from omni_core.models.layers import GatedMLP

    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    packed = 0
    for mlp in mlps:
        linears = (mlp.gate_up_proj, mlp.down_proj)
        if all(type(lin) is not PackedCpuLinear and packing_supported(lin.weight) for lin in linears):
            mlp.gate_up_proj, mlp.down_proj = (PackedCpuLinear(lin) for lin in linears)
            packed += 1
    return packed
