"""Linear layers on CPU with the weight pre-packed for oneDNN.

On this CPU (AVX-512, one thread, float32) oneDNN's matmul on a weight reordered once into its
blocked layout ran the logits head (8192 x 256) 1.5x faster than ``F.linear`` at one row and
1.9-2.6x at 8-32 rows; the small projections of a layer gained nothing or lost
(docs/benchmarks.md, AR engine, CPU). So only the logits heads use it.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


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
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self._source, self._stamp = weight, stamp
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, None, "none", [], "")


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place write counter (a weight loaded in place changes it); inference-mode
    tensors have none and cannot be written outside inference mode: 0."""
    try:
        return t._version
    except RuntimeError:
        return 0
