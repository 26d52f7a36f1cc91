"""The SiLU-gated feed-forward of the fast AR's and the codec's transformer layers, under the
checkpoint's names (``w1`` gate, ``w3`` up, ``w2`` down). ``fused`` (CUDA, where triton imports):
gate and up in one matmul over the two weights stacked once, the gating in one core kernel."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omni_core.models import kernels
from torch import nn


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self._gate_up: tuple[tuple, torch.Tensor] | None = None  # (the weights it was stacked from, w1 over w3)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        if fused:
            return self.w2(kernels.silu_mul(F.linear(x, self._stacked())))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

    def _stacked(self) -> torch.Tensor:
        """w1 over w3 in one tensor (a copy: the checkpoint keeps them apart), stacked again when
        either weight changed since (moved, cast, replaced or loaded into)."""
        w1, w3 = self.w1.weight, self.w3.weight
        source = (w1.data_ptr(), w3.data_ptr(), w1.dtype, w1.device, _version(w1), _version(w3))
        if self._gate_up is None or self._gate_up[0] != source:
            self._gate_up = (source, torch.cat([w1, w3]))
        return self._gate_up[1]


def _version(t: torch.Tensor) -> int | None:
    """The tensor's in-place write count; None for an inference tensor, which keeps none."""
    try:
        return t._version
    except RuntimeError:
        return None
