"""The logits head, ``hidden @ weight^T``, on the fastest path for where and how many rows it runs.

On CUDA, decode-sized batches (``kernels.SKINNY_MAX_ROWS`` rows or fewer) go through the fused
skinny linear kernel: it streams the head's weight at near copy bandwidth and takes part in
programmatic dependent launch, so its weight requests go out while the final norm still runs and
the greedy argmax after it launches early; cuBLAS's matrix-vector kernel did neither (on the H200,
a 6761 x 896 head took 7 us through cuBLAS inside a decode graph). On CPU the head runs on a
oneDNN-packed copy of the weight (``cpu_linear.PackedWeight``); anywhere else, ``F.linear``.
"""

from __future__ import annotations

import torch

from omni_core.models import kernels
from omni_core.models.cpu_linear import PackedWeight


class LogitsHead:
    """Call with ``(hidden [N, H], weight [V, H])``; keeps the CPU packed copy between calls."""

    def __init__(self):
        self._packed = PackedWeight()

    def __call__(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        if skinny_head(hidden, weight):
            return kernels.skinny_linear(hidden, weight)
        return self._packed.linear(hidden, weight)


def skinny_head(hidden: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused skinny kernel computes these logits (CUDA, few rows, triton importable)."""
    return (
        hidden.is_cuda
        and hidden.dim() == 2
        and 0 < hidden.shape[0] <= kernels.SKINNY_MAX_ROWS
        and hidden.dtype == weight.dtype
        and kernels.triton_available()
    )
