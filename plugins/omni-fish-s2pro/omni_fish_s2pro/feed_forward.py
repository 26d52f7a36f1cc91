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
        self._gate_up: torch.Tensor | None = None  # w1 over w3, stacked on first fused use (after loading)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        if fused:
            if self._gate_up is None:
                self._gate_up = torch.cat([self.w1.weight, self.w3.weight])
            return self.w2(kernels.silu_mul(F.linear(x, self._gate_up)))
        return self.w2(F.silu(self.w1(x)) * self.w3(x))
