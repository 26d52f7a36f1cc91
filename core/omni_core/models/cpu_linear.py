"""Linear layers on CPU with the weight pre-packed for oneDNN.

On this CPU (AVX-512, one thread, float32) oneDNN's matmul on a weight reordered once into its
blocked layout ran the logits head (8192 x 256) 1.5x faster than ``F.linear`` at one row and
1.9-2.6x at 8-32 rows; the small projections of a layer gained nothing or lost
(docs/benchmarks.md, AR engine, CPU). So only wide weights use it.
"""

from __future__ import annotations

import torch


def packing_supported(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class PackedWeight:
    """``weight`` reordered for oneDNN, remade when the weight tensor changes (a new load)."""

    def __init__(self):
        self._key = None
        self._packed = None

    def linear(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """``x @ weight^T`` for x [N, K] (float32, CPU)."""
        key = (weight.data_ptr(), _version(weight), tuple(weight.shape))
        if key != self._key:
            self._packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
            self._key = key
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self._packed, None, "none", [], "")


def _version(t: torch.Tensor) -> int:
    """The tensor's in-place write counter (a weight loaded in place changes it); inference-mode
    tensors have none and cannot be written outside inference mode: 0."""
    try:
        return t._version
    except RuntimeError:
        return 0
