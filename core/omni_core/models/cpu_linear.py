"""Linear layers on CPU with the weight pre-packed: for oneDNN, or for the host kernel
(``native/linear.c``).

On the development CPU (AVX-512, one thread, float32) oneDNN's matmul on a weight reordered once
into its blocked layout ran the logits head (8192 x 256) 1.5x faster than ``F.linear`` at one row
and 1.9-2.6x at 8-32 rows, and the MLP's gate/up and down projections 1.3-1.8x at 8-32 rows
(1.1-1.25x at 512); q/k/v and o_proj gained nothing or lost. The host kernel (one thread) ran
q/k/v, o_proj and down_proj 1.02-1.43x faster than the better of the two at 1-64 rows there and
about as fast at 512, gate/up (2048 columns) and the head (8192) 0.9x oneDNN at some row counts;
an engine at 32 requests 3.7-5.7% faster with it. On an Intel Xeon host the engine ran 9-40%
slower with it at 2-8 threads and within noise at one (docs/experiments/2026-12-03-cpu-engine-kernels.md). So
the logits heads (``PackedWeight``, beside the weight: a tied head's weight is also the
embedding) and gate/up take oneDNN, and ``pack_cpu_linears`` gives q/k/v, o_proj and down_proj
the host kernel where it measures faster on this CPU.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.models.native import linear as host_linear

log = logging.getLogger(__name__)

HOST_LINEAR_ENV = "OMNI_HOST_LINEAR"  # "1": the host kernel wherever built, "0": never, else measured
CALIBRATION_ROWS = (1, 8, 32)  # decode-sized batches, where the two differ most
HOST_KERNEL_MARGIN = 0.9  # the host kernel is taken at this share of the other's time or less


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


class HostLinear(nn.Module):
    """A float32 CPU ``nn.Linear`` whose weight is kept only in the host kernel's panels."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.packed = host_linear.pack(linear.weight)
        self.bias = None if linear.bias is None else linear.bias.detach().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = host_linear.linear(x.reshape(-1, self.in_features), self.packed, self.bias, self.out_features)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, packed for the host kernel"


def pack_cpu_linears(model: nn.Module, host_kernel: bool | None = None) -> int:
    """Packs the float32 CPU projections of ``model``'s decoder layers in place of their weights
    (the model's memory stays the same; its ``state_dict`` no longer holds them): each
    ``GatedMLP``'s gate/up for oneDNN; its down_proj, and each attention's ``qkv_proj`` / ``o_proj``,
    for the host kernel where it is taken, else down_proj for oneDNN and q/k/v, o_proj left to
    ``F.linear``; each MoE layer's ``Experts`` for the host experts kernel (``native/moe.c``) where
    it is preferred. ``host_kernel``: True takes the kernel wherever it is built, False never; None
    (the default, or ``OMNI_HOST_LINEAR``) where ``native.linear`` is preferred (few intra-op
    threads) and, per layer shape, it ran faster on this CPU than the alternative at
    ``CALIBRATION_ROWS`` rows (``_host_kernel_faster``). Returns how many linear layers were packed."""
    from omni_core.models.layers import GatedMLP
    from omni_core.models.moe import Experts
    from omni_core.models.native import moe as host_moe

    if host_kernel is None and os.environ.get(HOST_LINEAR_ENV) in ("0", "1"):
        host_kernel = os.environ[HOST_LINEAR_ENV] == "1"
    built = host_linear.available()
    faster: dict[tuple, bool] = {}  # per (in, out, bias, alternative): measured once

    def takes_kernel(lin: nn.Linear, alternative: type) -> bool:
        if not built or host_kernel is False:
            return False
        if host_kernel:
            return True
        if not host_linear.preferred():
            return False
        key = (lin.in_features, lin.out_features, lin.bias is not None, alternative)
        if key not in faster:
            faster[key] = _host_kernel_faster(lin, alternative)
        return faster[key]

    packed = 0
    for module in list(model.modules()):
        if isinstance(module, Experts):
            # every expert in one host-kernel call (native/moe.c) rather than ~6 torch ops each
            weight = module.gate_up_proj
            if module.host_packed is None and host_kernel is not False and weight.device.type == "cpu" and weight.dtype == torch.float32 and host_moe.preferred():
                module.pack_for_host()
                packed += 1
            continue
        # layer name -> what it runs without the host kernel (None: F.linear, it stays as it is)
        if isinstance(module, GatedMLP):
            onednn, candidates = ["gate_up_proj"], {"down_proj": PackedCpuLinear}
        elif isinstance(getattr(module, "qkv_proj", None), nn.Linear) and isinstance(getattr(module, "o_proj", None), nn.Linear):
            onednn, candidates = [], {"qkv_proj": None, "o_proj": None}
        else:
            continue
        for name in onednn + list(candidates):
            lin = getattr(module, name)
            if type(lin) in (PackedCpuLinear, HostLinear) or not packing_supported(lin.weight):
                continue
            kind = PackedCpuLinear if name in onednn else HostLinear if takes_kernel(lin, candidates[name]) else candidates[name]
            if kind is not None:
                setattr(module, name, kind(lin))
                packed += 1
    return packed


@torch.inference_mode()
def _host_kernel_faster(linear: nn.Linear, alternative: type | None) -> bool:
    """Whether the host kernel runs ``linear``'s shape in at most ``HOST_KERNEL_MARGIN`` of the time of
    ``alternative`` (a packed module type, or None for ``F.linear``), as the geometric mean over
    ``CALIBRATION_ROWS`` (best of a few calls each, at this thread count): a few milliseconds a
    shape, once per engine."""
    ours = HostLinear(linear)
    theirs = linear if alternative is None else alternative(linear)
    g = torch.Generator().manual_seed(0)
    ratios = []
    for rows in CALIBRATION_ROWS:
        x = torch.randn(rows, linear.in_features, generator=g)
        ratios.append(_best_seconds(ours, x) / _best_seconds(theirs, x))
    ratio = math.exp(sum(map(math.log, ratios)) / len(ratios))
    log.info("linear %dx%d: the host kernel took %.2f of %s's time", linear.in_features, linear.out_features, ratio, "F.linear" if alternative is None else alternative.__name__)
    return ratio <= HOST_KERNEL_MARGIN


def _best_seconds(module: nn.Module, x: torch.Tensor, trials: int = 7) -> float:
    module(x)  # warm-up: first-call costs (oneDNN's primitive cache, page faults) are not the steady state
    best = float("inf")
    for _ in range(trials):
        start = time.perf_counter()
        module(x)
        best = min(best, time.perf_counter() - start)
    return best
