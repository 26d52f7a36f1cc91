"""Small building blocks shared by the decoder backbones."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from omni_core.models import kernels
from omni_core.models.native import host_ops


class RMSNorm(nn.Module):
    """Root-mean-square norm. In float32 it matches the references exactly (normalise, then
    scale), except on the host kernel (``native.host_ops``, float32 on CPU), which sums the squares
    in another order (last-bit differences); in half precision one fused call (accumulating in
    float32) replaces their cast-normalise-cast-scale chain, rounding once instead of twice."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None, fused: bool = False):
        """``norm(x)``; with ``residual``, ``(norm(x + residual), x + residual)``. ``fused`` runs one
        Triton kernel (add, norm and both writes) instead of the torch ops."""
        if fused:
            return kernels.rms_norm(x, self.weight, self.eps, residual)
        if host_ops.takes(x, self.weight):
            return host_ops.add_rms_norm(x, self.weight, self.eps, residual)
        if residual is not None:
            residual = x + residual
            return self._norm(residual), residual
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:
            return self.weight * F.rms_norm(x, (x.shape[-1],), eps=self.eps)
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), eps=self.eps)


class PackedLinear(nn.Linear):
    """One matmul for several projections stored as separate checkpoint tensors.

    ``shard_sizes`` are the output rows of each part, in order (q, k, v or gate, up); the weight
    loader writes checkpoint part ``i`` into rows ``sum(shard_sizes[:i])`` onward.
    """

    def __init__(self, in_features: int, shard_sizes: list[int], bias: bool):
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = list(shard_sizes)

    def shard_offset(self, index: int) -> int:
        return sum(self.shard_sizes[:index])


class RotaryEmbedding(nn.Module):
    """NeoX-style rotary embedding (halves rotated) with a precomputed cos/sin table.

    With ``mrope_section`` (multimodal rotary, M-RoPE: Qwen2-VL, Qwen3-Omni) a position has
    several axes (time, height, width): each frequency of the head takes its angle from one
    axis, chosen by contiguous sections of the frequencies or, ``interleaved``, in turn (t, h, w,
    t, h, w, ...) over the first ``3 * section`` frequencies. Positions are then ``[axes, T]``;
    one-axis positions ``[T]`` (text) rotate every frequency by the same position, which is what
    equal axes give."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, mrope_section: list[int] | None = None, interleaved: bool = False):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)
        axes = rotary_axes(head_dim // 2, list(mrope_section), interleaved) if mrope_section else None
        # [head_dim]: the position axis each column rotates by (None: one axis)
        self.register_buffer("axes", None if axes is None else torch.cat([axes, axes]), persistent=False)

    def table(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin at ``positions`` ([T, 1, D]); looked up once per step, shared by all layers.
        ``positions`` [axes, T] (multimodal rotary) take each column from its axis's row."""
        if positions.dim() == 1:
            return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)
        if self.axes is None:
            raise ValueError(f"positions of shape {tuple(positions.shape)} need a multimodal rotary (mrope_section)")
        columns = torch.arange(self.cos.shape[1], device=positions.device)
        rows = positions[self.axes]  # [D, T]: the position each column of each token rotates by
        cos, sin = self.cos[rows, columns[:, None]].T, self.sin[rows, columns[:, None]].T
        return cos.unsqueeze(1).to(dtype), sin.unsqueeze(1).to(dtype)


def rotary_axes(half_dim: int, section: list[int], interleaved: bool) -> torch.Tensor:
    """Which position axis each of ``half_dim`` rotary frequencies uses (0 time, 1 height, 2 width)."""
    if sum(section) != half_dim:
        raise ValueError(f"mrope_section {section} must add up to half the head size ({half_dim})")
    if not interleaved:
        return torch.repeat_interleave(torch.arange(len(section)), torch.tensor(section))
    axes = torch.zeros(half_dim, dtype=torch.int64)
    for axis in range(1, len(section)):
        axes[axis : section[axis] * len(section) : len(section)] = axis
    return axes


def apply_rotary(q: torch.Tensor, k: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k rotated: ``x * cos + rotate_half(x) * sin`` (the references' arithmetic, bit for
    bit), on q and k stacked along the heads so that each op runs once (a decode step's tensors
    are small, and the ops' fixed cost dominates). Returns views of one [T, q + k heads, d] tensor."""
    cos, sin = rope
    qk = torch.cat([q, k], dim=1)
    out = qk * cos
    out += _rotate_half(qk).mul_(sin)
    return out.split([q.shape[1], k.shape[1]], dim=1)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


CPU_MLP_ROWS = 512  # rows of a CPU MLP computed at once (GatedMLP.forward)


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)) with gate and up fused in one matmul."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_up_proj = PackedLinear(hidden, [intermediate, intermediate], bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor, fused: bool = False) -> torch.Tensor:
        rows = x.shape[0]
        if x.device.type != "cpu" or x.dim() != 2 or rows <= CPU_MLP_ROWS:
            return self._forward(x, fused)
        # on CPU a long prefill runs in row chunks: each chunk's temporaries (gate/up output,
        # activation) stay in cache and are reused from malloc's heap, where a whole step's
        # (32 MB for 4096 rows here) were fresh pages the kernel had to fault in every layer
        out = torch.empty(rows, self.down_proj.out_features, dtype=x.dtype)
        for start in range(0, rows, CPU_MLP_ROWS):
            out[start : start + CPU_MLP_ROWS] = self._forward(x[start : start + CPU_MLP_ROWS], fused)
        return out

    def _forward(self, x: torch.Tensor, fused: bool) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if fused:
            return self.down_proj(kernels.silu_mul(gate_up))
        if host_ops.takes(gate_up):
            return self.down_proj(host_ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def forward_rows(self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mlp(norm(x + residual)), x + residual)`` for few rows, in two fused kernels
        (add + norm + gate/up projection + SiLU gate; down projection)."""
        act, residual = kernels.skinny_gated_linear(x, self.gate_up_proj.weight, residual, norm.weight, norm.eps)
        return kernels.skinny_linear(act, self.down_proj.weight), residual


def rope_parameters(config) -> dict:
    """A transformers config's rotary settings, new (``rope_parameters``) or old (``rope_scaling``) style."""
    return dict(getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {})


def rope_theta(config) -> float:
    """The rotary base from a transformers config, old (``rope_theta``) or new (``rope_parameters``) style."""
    params = rope_parameters(config)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "mrope", None):
        raise NotImplementedError(f"rope type {rope_type!r} is not supported by the shared backbones")
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    return float(theta if theta is not None else 10000.0)


def mrope_settings(config) -> tuple[list[int] | None, bool]:
    """(``mrope_section``, interleaved) of a multimodal rotary, or (None, False) for a plain one."""
    params = rope_parameters(config)
    section = params.get("mrope_section")
    interleaved = bool(params.get("interleaved", params.get("mrope_interleaved", False)))
    return (list(section) if section else None), interleaved
