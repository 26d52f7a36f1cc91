"""The flow's velocity estimator: a DiT with AdaLN-zero blocks over [noisy mel, prompt mel, mu, speaker].

Module and parameter names follow the official ``flow.pt`` (``decoder.estimator.*``). Attention is
full over the valid frames, or chunk-causal (each chunk of ``static_chunk_size`` frames sees
itself and every earlier chunk) when streaming, which is what makes chunked decoding reproduce
the one-shot result. Rotary position covers only the first ``dim_head`` channels of the
projected queries/keys (the first head), with interleaved pairs, as the checkpoint was trained.
"""

from __future__ import annotations

import functools
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

    def forward(self, x: torch.Tensor, past=None) -> torch.Tensor:  # [B, T, D]
        if past is not None:
            return self._continue(x, past)
        h = x.transpose(1, 2)
        h = self.conv1(F.pad(h, (self.kernel_size - 1, 0)))
        h = self.conv2(F.pad(h, (self.kernel_size - 1, 0)))
        return h.transpose(1, 2)

    def _continue(self, x: torch.Tensor, past) -> torch.Tensor:
        """New frames after cached ones: each conv's left context is the cached last
        ``kernel - 1`` inputs (zeros before the first frame, as the padding), not padding."""
        context = past.conv_context()  # [B, 2 convs, kernel - 1, D]
        first = torch.cat([context[:, 0], x], dim=1)
        h = self.conv1(first.transpose(1, 2)).transpose(1, 2)
        second = torch.cat([context[:, 1], h], dim=1)
        out = self.conv2(second.transpose(1, 2)).transpose(1, 2)
        last = past.last_frames()[:, :, None].expand(-1, -1, x.shape[2])
        past.keep_conv_context(torch.stack([first.gather(1, last), second.gather(1, last)], dim=1))
        return out


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim: int, mu_dim: int, out_dim: int, spk_dim: int):
        super().__init__()
        self.proj = nn.Linear(mel_dim * 2 + mu_dim + spk_dim, out_dim)
        self.conv_pos_embed = CausalConvPositionEmbedding(out_dim)

    def forward(self, x, cond, mu, spks, past=None) -> torch.Tensor:
        spks = spks[:, None, :].expand(-1, x.shape[1], -1)
        h = self.proj(torch.cat([x, cond, mu, spks], dim=-1))
        return self.conv_pos_embed(h, past) + h


class RotaryEmbedding(nn.Module):
    def __init__(self, dim: int, base: float = 10000.0):
        super().__init__()
        self.register_buffer("inv_freq", 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)))

    def tables(self, seq_len: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 (cos, signed sin) [T, width]: channels past ``dim_head`` pass through (cos 1, sin 0)."""
        t = torch.arange(seq_len, device=self.inv_freq.device, dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq.float())  # [T, dim_head / 2]
        cos = torch.ones(seq_len, width, device=freqs.device)
        sin = torch.zeros(seq_len, width, device=freqs.device)
        rot = 2 * freqs.shape[1]
        # each angle twice (interleaved pairs); expand, not repeat_interleave: graph-capturable
        cos[:, :rot] = freqs.cos()[:, :, None].expand(-1, -1, 2).flatten(1)
        sin[:, 0:rot:2], sin[:, 1:rot:2] = -freqs.sin(), freqs.sin()
        return cos, sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate interleaved channel pairs of ``x`` [B, T, C]: (a, b) -> (a cos - b sin, b cos + a sin),
    in float32; the tables leave the channels past the first head unchanged."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (x * cos + swapped * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, dim_head: int):
        super().__init__()
        self.heads, self.dim_head = heads, dim_head
        inner = heads * dim_head
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(dim, inner)
        self.to_v = nn.Linear(dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim), nn.Dropout(0.0)])

    def fuse(self) -> None:
        """One q|k|v matmul instead of three (the checkpoint keeps the three)."""
        weight = torch.cat([self.to_q.weight, self.to_k.weight, self.to_v.weight]).detach()
        bias = torch.cat([self.to_q.bias, self.to_k.bias, self.to_v.bias]).detach()
        self.register_buffer("qkv_weight", weight, persistent=False)
        self.register_buffer("qkv_bias", bias, persistent=False)

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], past=None
    ) -> torch.Tensor:
        """``past``: the cached frames' keys/values of this block (``past(k, v)`` adds the new
        frames' and returns all), so only the new frames are queries."""
        b, t, _ = x.shape
        if hasattr(self, "qkv_weight"):
            q, k, v = F.linear(x, self.qkv_weight, self.qkv_bias).chunk(3, dim=-1)
        else:
            q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        if past is not None:
            k, v = past(k, v)
        q, k, v = (z.unflatten(2, (self.heads, self.dim_head)).transpose(1, 2) for z in (q, k, v))
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

    def forward(self, x, mod, attn_mask, rope, valid, past=None) -> torch.Tensor:
        """``mod`` [B, 6, dim]: this block's AdaLN-zero modulation of the time embedding."""
        shift_a, scale_a, gate_a, shift_f, scale_f, gate_f = mod[:, :, None].unbind(1)
        h = self.attn_norm.norm(x) * (1 + scale_a) + shift_a
        x = x + gate_a * (self.attn(h, attn_mask, rope, past) * valid)
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

    def fuse(self) -> None:
        """Pack weights for fewer, larger matmuls: every block's q|k|v, and all blocks' AdaLN
        modulations (they read the same time embedding) in one. Call after loading weights."""
        for block in self.transformer_blocks:
            block.attn.fuse()
        linears = [block.attn_norm.linear for block in self.transformer_blocks]
        self.register_buffer("mod_weight", torch.cat([m.weight for m in linears]).detach(), persistent=False)
        self.register_buffer("mod_bias", torch.cat([m.bias for m in linears]).detach(), persistent=False)

    def forward(self, x, valid, mu, t, spks, cond, streaming: torch.Tensor, past=None) -> torch.Tensor:
        """x, mu, cond: [B, 80, T]; valid, streaming: [B, T], [B] bool; t: [B]; spks: [B, 80] -> [B, 80, T].

        With ``past`` (a ``flow_cache.CachedFrames`` at this Euler step) the T frames are each
        row's new frames after its cached ones, under the chunk mask."""
        x, mu, cond = x.transpose(1, 2), mu.transpose(1, 2), cond.transpose(1, 2)
        t_emb = self.time_embed(t)
        h = self.input_embed(x, cond, mu, spks, past)
        b, seq, dim = h.shape
        width = self.transformer_blocks[0].attn.to_q.out_features
        if past is None:
            rope = self.rotary_embed.tables(seq, width)
            attn_mask = chunk_attention_mask(valid, streaming, self.static_chunk_size)
        else:
            rope, attn_mask = past.rope(self.rotary_embed, width), past.mask
        valid_f = valid[:, :, None].to(h.dtype)
        act = F.silu(t_emb)
        if hasattr(self, "mod_weight"):
            mods = (
                F.linear(act, self.mod_weight, self.mod_bias)
                .view(b, len(self.transformer_blocks), 6, dim)
                .unbind(1)
            )
        else:
            mods = [blk.attn_norm.linear(act).view(b, 6, dim) for blk in self.transformer_blocks]
        for layer, (block, mod) in enumerate(zip(self.transformer_blocks, mods, strict=True)):
            kv = None if past is None else functools.partial(past.extend, layer)
            h = block(h, mod, attn_mask, rope, valid_f, kv)
        scale, shift = self.norm_out.linear(act).chunk(2, dim=1)
        h = self.norm_out.norm(h) * (1 + scale[:, None]) + shift[:, None]
        return self.proj_out(h).transpose(1, 2)
