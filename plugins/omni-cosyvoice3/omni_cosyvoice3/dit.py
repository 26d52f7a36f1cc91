"""The flow's velocity estimator: a DiT with AdaLN-zero blocks over [noisy mel, prompt mel, mu, speaker].

Module and parameter names follow the official ``flow.pt`` (``decoder.estimator.*``). Attention is
full over the valid frames, or chunk-causal (each chunk of ``static_chunk_size`` frames sees
itself and every earlier chunk) when streaming, which is what makes chunked decoding reproduce
the one-shot result. Rotary position covers only the first ``dim_head`` channels of the
projected queries/keys (the first head), with interleaved pairs, as the checkpoint was trained.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .config import FlowConfig


class SinusoidalTime(nn.Module):
    def __init__(self, dim: int = 256):
        super().__init__()
        self.dim = dim

    def forward(self, t: torch.Tensor, scale: float = 1000.0) -> torch.Tensor:
        half = self.dim // 2
        freqs = torch.exp(
            torch.arange(half, device=t.device, dtype=torch.float32) * -(math.log(10000) / (half - 1))
        )
        angles = scale * t.float()[:, None] * freqs[None]
        return torch.cat([angles.sin(), angles.cos()], dim=-1)


class TimestepEmbedding(nn.Module):
    def __init__(self, dim: int, freq_dim: int = 256):
        super().__init__()
        self.time_embed = SinusoidalTime(freq_dim)
        self.time_mlp = nn.Sequential(nn.Linear(freq_dim, dim), nn.SiLU(), nn.Linear(dim, dim))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.time_mlp(self.time_embed(t).to(self.time_mlp[0].weight.dtype))


class CausalConvPositionEmbedding(nn.Module):
    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16):
        super().__init__()
        self.kernel_size = kernel_size
        self.conv1 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())
        self.conv2 = nn.Sequential(nn.Conv1d(dim, dim, kernel_size, groups=groups), nn.Mish())

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D]
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (self.kernel_size - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel_size - 1, 0)))
        return h.transpose(1, 2)


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, mu_dim: int, out_dim: int, spk_dim: int):
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(out_dim)

    def forward(self, x, cond, mu, spks) -> torch.Tensor:
        spks = spks[:, None, :].expand(-1, x.shape[1], -1)
        h = self.proj(torch.cat([x, cond, mu, spks], dim=-1))
        return self.conv_pos_embed(h) + h


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def forward(self, seq_len: int) -> torch.Tensor:
        t = torch.arange(seq_len, device=self.inv_freq.device, dtype=self.inv_freq.dtype)
        freqs = torch.outer(t, self.inv_freq)
        return freqs.repeat_interleave(2, dim=-1)  # [T, dim_head], pairs interleaved


def apply_rotary(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``freqs.shape[-1]`` channels of ``x`` [B, T, C] by interleaved pairs."""
    rot = freqs.shape[-1]
    head, rest = x[..., :rot].float(), x[..., rot:]
    pairs = head.unflatten(-1, (-1, 2))
    rotated_half = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    out = head * freqs.cos() + rotated_half * freqs.sin()
    return torch.cat([out.to(x.dtype), rest], dim=-1)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = apply_rotary(self.to_q(x), freqs)
        k = apply_rotary(self.to_k(x), freqs)
        v = self.to_v(x)
        q, k, v = (z.view(b, t, self.heads, self.dim_head).transpose(1, 2) for z in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return self.to_out[0](out.transpose(1, 2).reshape(b, t, -1))


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim: int, chunks: int = 6):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(dim, dim * chunks)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)


class FeedForward(nn.Module):
    def __init__(self, dim: int, mult: int):
        super().__init__()
        inner = int(dim * mult)
        self.ff = nn.Sequential(
            nn.Sequential(nn.Linear(dim, inner), nn.GELU(approximate="tanh")),
            nn.Dropout(0.0),
            nn.Linear(inner, dim),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ff(x)


class DiTBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int, ff_mult: int):
        super().__init__()
        self.attn_norm = AdaLayerNormZero(dim, 6)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x, t_emb, attn_mask, freqs, valid) -> torch.Tensor:
        mod = self.attn_norm.linear(self.attn_norm.silu(t_emb))
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = (m[:, None] for m in mod.chunk(6, dim=1))
        h = self.attn_norm.norm(x) * (1 + scale_a) + shift_a
        x = x + gate_a * (self.attn(h, attn_mask, freqs) * valid)
        h = self.ff_norm(x) * (1 + scale_f) + shift_f
        return x + gate_f * self.ff(h)


def chunk_attention_mask(valid: torch.Tensor, streaming: torch.Tensor, chunk: int) -> torch.Tensor:
    """[B, 1, T, T] bool: keys must be valid; in a streaming row a query sees its own and earlier chunks."""
    t = valid.shape[1]
    keys = valid[:, None, None, :]
    pos = torch.arange(t, device=valid.device)
    reach = (pos // chunk + 1) * chunk
    causal = (pos[None, :] < reach[:, None])[None, None]
    return keys & (causal | ~streaming[:, None, None, None])


class DiT(nn.Module):
    def __init__(self, cfg: FlowConfig):
        super().__init__()
        dim, mel = cfg.dim, cfg.mel_bins
        self.time_embed = TimestepEmbedding(dim)
        self.input_embed = InputEmbedding(mel, mel, dim, mel)
        self.rotary_embed = RotaryEmbedding(cfg.dim_head)
        self.transformer_blocks = nn.ModuleList(
            DiTBlock(dim, cfg.heads, cfg.dim_head, cfg.ff_mult) for _ in range(cfg.depth)
        )
        self.norm_out = AdaLayerNormZero(dim, 2)
        self.proj_out = nn.Linear(dim, mel)
        self.static_chunk_size = cfg.static_chunk_size

    def forward(self, x, valid, mu, t, spks, cond, streaming: torch.Tensor) -> torch.Tensor:
        """x, mu, cond: [B, 80, T]; valid, streaming: [B, T], [B] bool; t: [B]; spks: [B, 80] -> [B, 80, T]."""
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        t_emb = self.time_embed(t)
        h = self.input_embed(x, cond, mu, spks)
        freqs = self.rotary_embed(h.shape[1])
        attn_mask = chunk_attention_mask(valid, streaming, self.static_chunk_size)
        valid_f = valid[:, :, None].to(h.dtype)
        for block in self.transformer_blocks:
            h = block(h, t_emb, attn_mask, freqs, valid_f)
        scale, shift = self.norm_out.linear(self.norm_out.silu(t_emb)).chunk(2, dim=1)
        h = self.norm_out.norm(h) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out(h).transpose(1, 2)
