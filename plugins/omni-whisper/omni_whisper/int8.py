"""int8 weights for Whisper's linear layers and its output projection, on the CPU.

Weights are quantised once per output channel (symmetric, scale = max |w| / 127); activations
are quantised per call (dynamic, per tensor) inside PyTorch's quantized ``linear_dynamic`` op
(fbgemm / x86 backend: VNNI int8 GEMMs with an int32 accumulator, float32 in and out).
Everything else (convolutions, attention, norms, embeddings) stays float32.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from omni_whisper.cpu_features import cpu_has_vnni

# Without VNNI, fbgemm sums pairs of u8 x s8 products in int16, which 8-bit activations can
# saturate: there activations keep 7 bits (reduce_range). With VNNI all 8 bits are used; on the
# 24 benchmark clips the 7-bit activations cost 3 points of word error rate (3.9% -> 6.8%).
REDUCE_RANGE = not cpu_has_vnni()


def int8_supported() -> tuple[bool, str]:
    """Whether this torch build has the quantized CPU linear op with an x86 backend."""
    engines = torch.backends.quantized.supported_engines
    try:
        torch.ops.quantized.linear_dynamic  # noqa: B018 - resolving the op is the check
    except (AttributeError, RuntimeError):
        return False, "this torch build has no quantized.linear_dynamic op"
    if not {"x86", "fbgemm"} & set(engines):
        return False, f"no x86/fbgemm quantized engine (available: {engines})"
    return True, ""


def _select_engine() -> None:
    engines = torch.backends.quantized.supported_engines
    if torch.backends.quantized.engine not in ("x86", "fbgemm"):
        torch.backends.quantized.engine = "x86" if "x86" in engines else "fbgemm"


class Int8Linear(nn.Module):
    """A linear layer whose weight is held as prepacked int8 with per-output-channel scales."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        weight = weight.detach().float()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        scales = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
        zero_points = torch.zeros(self.out_features, dtype=torch.long)
        _select_engine()
        with warnings.catch_warnings():
            # quantized tensors are flagged for a future removal; the op is the maintained int8 CPU GEMM today
            warnings.simplefilter("ignore", UserWarning)
            quantized = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            self._packed = torch.ops.quantized.linear_prepack(
                quantized, None if bias is None else bias.detach().float()
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self._packed, REDUCE_RANGE)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize_linears(module: nn.Module) -> int:
    """Replace every ``nn.Linear`` inside ``module`` by an ``Int8Linear``; returns how many."""
    count = 0
    for name, child in list(module.named_children()):
        if isinstance(child, nn.Linear):
            setattr(module, name, Int8Linear(child.weight, child.bias))
            count += 1
        else:
            count += quantize_linears(child)
    return count
