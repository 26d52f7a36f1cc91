"""Qwen3-Omni's code2wav (``code2wav.*``): codec codes of every codebook at 12.5 Hz to 24 kHz audio.

Codes ``[B, Q, T]`` are embedded per codebook (one table, offset by codebook) and averaged; a
causal transformer with a sliding window (RMSNorm, rotary attention, SiLU MLP, layer scales)
runs over the frames; two causal transposed convolutions with ConvNeXt blocks upsample 4x; a
causal convolutional decoder (SnakeBeta activations, transposed-convolution upsampling by each of
``upsample_rates``, residual units with dilations 1, 3 and 9) makes the waveform, clamped to
[-1, 1]. Everything is causal, so a long code sequence is decoded in chunks, each with
``left_context`` frames of the codes before it whose samples are dropped (``decode_chunk``), as
the reference's chunked decode does; streaming is that with the chunks arriving over time.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from omni_core.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rotary
from torch import nn


class CausalConv(nn.Module):
    """A 1-D convolution padded on the left only (and on the right to whole strides)."""

    def __init__(self, cin: int, cout: int, kernel: int, dilation: int = 1, stride: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, dilation=dilation, groups=groups)
        self.stride = stride
        self.span = (kernel - 1) * dilation + 1
        self.padding = self.span - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length = x.shape[-1]
        frames = (length - self.span + self.padding) / self.stride + 1
        extra = (math.ceil(frames) - 1) * self.stride + (self.span - self.padding) - length
        return self.conv(F.pad(x, (self.padding, extra)))


class CausalTransConv(nn.Module):
    """A transposed convolution trimmed to ``stride`` samples per input frame."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(cin, cout, kernel, stride=stride)
        self.trim = kernel - stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        return x[..., self.trim : x.shape[-1] - self.trim] if self.trim else x


class SnakeBeta(nn.Module):
    """x + sin(x * e^alpha)^2 / e^beta, per channel."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        alpha = self.alpha.exp()[None, :, None]
        beta = self.beta.exp()[None, :, None]
        return x + (1.0 / (beta + 1e-9)) * torch.sin(x * alpha).pow(2)


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.dwconv(x).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv(dim, dim, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(self.act2(self.conv1(self.act1(x))))


class DecoderBlock(nn.Module):
    def __init__(self, cin: int, cout: int, rate: int):
        super().__init__()
        units = [ResidualUnit(cout, d) for d in (1, 3, 9)]
        self.block = nn.ModuleList([SnakeBeta(cin), CausalTransConv(cin, cout, 2 * rate, rate), *units])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.block:
            x = layer(x)
        return x


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_proj = nn.Linear(dim, heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, dim, bias=False)

    def forward(self, x: torch.Tensor, rope, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b * t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b * t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, k, rope)
        q = q.view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = k.reshape(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        dim = config.hidden_size
        head_dim = getattr(config, "head_dim", None) or dim // config.num_attention_heads
        self.self_attn = Attention(dim, config.num_attention_heads, config.num_key_value_heads, head_dim)
        self.mlp = GatedMLP(dim, config.intermediate_size)
        self.input_layernorm = RMSNorm(dim, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(dim, config.rms_norm_eps)
        self.self_attn_layer_scale = LayerScale(dim)
        self.mlp_layer_scale = LayerScale(dim)

    def forward(self, x, rope, mask):
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), rope, mask))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class PreTransformer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        params = getattr(config, "rope_parameters", None) or {}
        self.rotary = RotaryEmbedding(head_dim, config.max_position_embeddings, float(params.get("rope_theta", 10000.0)))
        self.window = config.sliding_window

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        positions = torch.arange(t, device=x.device)
        rope = self.rotary.table(positions.repeat(x.shape[0]), x.dtype)
        # causal, and each frame sees only the last ``window`` frames (itself included)
        mask = (positions[None, :] <= positions[:, None]) & (positions[None, :] > positions[:, None] - self.window)
        for layer in self.layers:
            x = layer(x, rope, mask)
        return self.norm(x)


class Code2Wav(nn.Module):
    """Module names follow the checkpoint (``code2wav.*``)."""

    def __init__(self, config):
        super().__init__()
        self.num_quantizers = config.num_quantizers
        self.codebook_size = config.codebook_size
        self.samples_per_frame = int(math.prod(list(config.upsample_rates) + list(config.upsampling_ratios)))
        self.code_embedding = nn.Embedding(config.codebook_size * config.num_quantizers, config.hidden_size)
        self.pre_transformer = PreTransformer(config)
        dim = config.hidden_size
        self.upsample = nn.ModuleList(nn.ModuleList([CausalTransConv(dim, dim, f, f), ConvNeXtBlock(dim)]) for f in config.upsampling_ratios)
        decoder: list[nn.Module] = [CausalConv(dim, config.decoder_dim, 7)]
        for i, rate in enumerate(config.upsample_rates):
            decoder.append(DecoderBlock(config.decoder_dim // 2**i, config.decoder_dim // 2 ** (i + 1), rate))
        out = config.decoder_dim // 2 ** len(config.upsample_rates)
        decoder += [SnakeBeta(out), CausalConv(out, 1, 7)]
        self.decoder = nn.ModuleList(decoder)
        self.register_buffer("code_offset", torch.arange(config.num_quantizers).view(1, -1, 1) * config.codebook_size, persistent=False)

    @torch.inference_mode()
    def forward(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, Q, T] -> waveform [B, 1, samples]."""
        if codes.shape[1] != self.num_quantizers:
            raise ValueError(f"expected {self.num_quantizers} codebooks, got {codes.shape[1]}")
        hidden = self.code_embedding(codes + self.code_offset).mean(1)
        hidden = self.pre_transformer(hidden).transpose(1, 2)
        for blocks in self.upsample:
            for block in blocks:
                hidden = block(hidden)
        for block in self.decoder:
            hidden = block(hidden)
        return hidden.clamp(-1, 1)

    def decode_chunk(self, codes: torch.Tensor, context: int) -> torch.Tensor:
        """codes [B, Q, context + n] whose first ``context`` frames were decoded before ->
        the n new frames' samples [B, n * samples_per_frame]."""
        return self(codes)[:, 0, context * self.samples_per_frame :]
