"""The building blocks of S2-Pro's codec (a causal DAC variant): causal convolutions, Snake
activations, residual units, ConvNeXt blocks and causal transformers whose attention sees a
window of past positions. Every block is causal, so a stream decoded piece by piece equals the
whole decode (``codec_stream``). Module names follow codec.pth.

``weight_norm`` marks the convolutions stored in codec.pth as weight-normed pairs (magnitude
``original0``, direction ``original1``): the loader folds each pair into one weight
(``codec_checkpoint``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from omni_core.models.layers import RMSNorm, apply_rotary
from torch import nn

from .feed_forward import FeedForward


class CausalConv1d(nn.Module):
    """A convolution padded on the left only (and on the right to whole strides)."""

    def __init__(
        self,
        cin: int,
        cout: int,
        kernel: int,
        stride: int = 1,
        dilation: int = 1,
        groups: int = 1,
        weight_norm: bool = True,
    ):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride, self.span = stride, (kernel - 1) * dilation + 1
        self.weight_norm = weight_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        left = self.span - self.stride
        frames = math.ceil((x.shape[-1] - self.span + left) / self.stride + 1)
        right = (frames - 1) * self.stride + self.span - left - x.shape[-1]
        return self.conv(F.pad(x, (left, right)))


class CausalConvTranspose1d(nn.Module):
    """A transposed convolution whose output is trimmed on the right: sample t depends on inputs up to t // stride."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int, weight_norm: bool = True):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride
        self.weight_norm = weight_norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x)
        return y[..., : y.shape[-1] - self.trim]


class Snake1d(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, channels, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + (self.alpha + 1e-9).reciprocal() * torch.sin(self.alpha * x).pow(2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            Snake1d(dim),
            CausalConv1d(dim, dim, 7, dilation=dilation),
            Snake1d(dim),
            CausalConv1d(dim, dim, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim, weight_norm=False)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


def rotary_at(
    positions: torch.Tensor, head_dim: int, base: float, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [T, 1, head_dim] at any positions (a stream's grow without bound: no table)."""
    inv_freq = 1.0 / (
        base ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    )
    angles = positions.to(torch.float32)[:, None] * inv_freq
    angles = torch.cat([angles, angles], dim=-1)[:, None]
    return angles.cos().to(dtype), angles.sin().to(dtype)


@dataclass
class WindowCache:
    """A stream's keys and values of the last ``window - 1`` positions, per layer, and how many
    positions it has seen."""

    seen: int = 0
    layers: list = field(default_factory=list)  # (k, v) [B, kept, heads, d] per layer


def kept_positions(cache: WindowCache | None) -> int:
    return cache.layers[0][0].shape[1] if cache is not None and cache.layers else 0


class WindowAttention(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int):
        super().__init__()
        self.heads, self.head_dim = heads, head_dim
        self.wqkv = nn.Linear(dim, 3 * heads * head_dim, bias=False)
        self.wo = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope, past, mask: torch.Tensor):
        """x [B, n, D]; ``past`` (k, v) [B, p, heads, d] or None; ``mask`` [n, p + n] (True: attend).
        Returns the output and this layer's (k, v) over past and new positions."""
        b, n, _ = x.shape
        q, k, v = self.wqkv(x).reshape(b * n, 3 * self.heads, self.head_dim).split(self.heads, dim=1)
        q, k = apply_rotary(q, k, rope)
        k, v = k.reshape(b, n, self.heads, self.head_dim), v.reshape(b, n, self.heads, self.head_dim)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=1), torch.cat([past[1], v], dim=1)
        out = F.scaled_dot_product_attention(
            q.reshape(b, n, self.heads, self.head_dim).transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            attn_mask=mask,
        )
        return self.wo(out.transpose(1, 2).reshape(b, n, -1)), (k, v)


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.gamma = nn.Parameter(torch.full((dim,), 1e-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class WindowBlock(nn.Module):
    def __init__(self, dim: int, heads: int, head_dim: int, hidden: int, eps: float):
        super().__init__()
        self.attention = WindowAttention(dim, heads, head_dim)
        self.feed_forward = FeedForward(dim, hidden)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)
        self.attention_layer_scale = LayerScale(dim)
        self.ffn_layer_scale = LayerScale(dim)

    def forward(self, x, rope, past, mask):
        h, kv = self.attention(self.attention_norm(x), rope, past, mask)
        h = x + self.attention_layer_scale(h)
        return h + self.ffn_layer_scale(self.feed_forward(self.ffn_norm(h))), kv


class WindowTransformer(nn.Module):
    """A causal transformer over channels-first input whose positions attend to the last
    ``window`` positions (themselves included). With a ``WindowCache`` it continues a stream:
    the result is the same as over the whole sequence at once."""

    HEAD_DIM = 64

    def __init__(
        self, dim: int, layers: int, hidden: int, window: int, eps: float = 1e-5, rope_base: float = 10000.0
    ):
        super().__init__()
        heads = max(1, dim // self.HEAD_DIM)
        self.head_dim, self.window, self.rope_base = dim // heads, window, rope_base
        self.layers = nn.ModuleList(
            WindowBlock(dim, heads, self.head_dim, hidden, eps) for _ in range(layers)
        )
        self.norm = RMSNorm(dim, eps)

    def forward(self, x: torch.Tensor, caches: list[WindowCache] | None = None) -> torch.Tensor:
        """x [B, D, n] -> [B, D, n]. ``caches`` (one a row) hold the positions before these and are
        updated; their rows must keep as many positions each (``kept``)."""
        b, n = x.shape[0], x.shape[-1]
        caches = caches or [None] * b
        kept = kept_positions(caches[0])
        if any(kept_positions(c) != kept for c in caches):
            raise ValueError("rows decoded together must keep as many past positions")
        seen = torch.tensor([c.seen if c is not None else 0 for c in caches], device=x.device)
        positions = (seen[:, None] + torch.arange(n, device=x.device)).reshape(-1)
        gap = (kept + torch.arange(n, device=x.device))[:, None] - torch.arange(kept + n, device=x.device)[
            None, :
        ]
        mask = (gap >= 0) & (
            gap < self.window
        )  # the same for every row: their keys are their own last positions
        h = x.transpose(1, 2)
        rope = rotary_at(positions, self.head_dim, self.rope_base, h.dtype)
        for i, layer in enumerate(self.layers):
            past = None
            if kept:
                past = tuple(torch.cat([c.layers[i][j] for c in caches]) for j in (0, 1))
            h, (k, v) = layer(h, rope, past, mask)
            for row, cache in enumerate(caches):
                if cache is not None:
                    last = k.shape[1] - min(k.shape[1], self.window - 1)
                    cache.layers[i : i + 1] = [(k[row : row + 1, last:], v[row : row + 1, last:])]
        for cache in caches:
            if cache is not None:
                cache.seen += n
        return self.norm(h).transpose(1, 2)
