"""The Qwen3-ASR audio encoder and projector in MLX.

Mel frames are cut into chunks of ``2 * n_window`` (100) frames; each chunk goes through three
stride-2 convolutions (13 tokens, ~12.5 Hz) and gets sinusoidal positions counted from zero
inside the chunk. The tokens of one audio then attend within windows of ``n_window_infer`` mel
frames (8 chunks, 104 tokens); windows are independent, so they run as one batch.
"""

from __future__ import annotations

import math

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .config import EncoderConfig, audio_token_count, post_conv_length


def sinusoid_table(length: int, channels: int, max_timescale: float = 10000.0) -> mx.array:
    increment = math.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = np.exp(-increment * np.arange(channels // 2, dtype=np.float32))
    scaled = np.arange(length, dtype=np.float32)[:, None] * inv_timescales[None, :]
    return mx.array(np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1).astype(np.float32))


class EncoderAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.scale = (dim // heads) ** -0.5
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def __call__(self, x: mx.array, shape: tuple[int, int], mask: mx.array | None) -> mx.array:
        batch, length = shape  # x is [batch * length, dim]: one matrix product per projection

        def heads(t: mx.array) -> mx.array:
            return t.reshape(batch, length, self.heads, -1).transpose(0, 2, 1, 3)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.out_proj(out.transpose(0, 2, 1, 3).reshape(batch * length, -1))


class EncoderLayer(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.self_attn = EncoderAttention(config.d_model, config.heads)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model)
        self.fc1 = nn.Linear(config.d_model, config.ffn_dim)
        self.fc2 = nn.Linear(config.ffn_dim, config.d_model)
        self.final_layer_norm = nn.LayerNorm(config.d_model)

    def __call__(self, x: mx.array, shape: tuple[int, int], mask: mx.array | None) -> mx.array:
        x = x + self.self_attn(self.self_attn_layer_norm(x), shape, mask)
        return x + self.fc2(nn.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.config = config
        channels = config.conv_channels
        self.conv2d1 = nn.Conv2d(1, channels, 3, stride=2, padding=1)
        self.conv2d2 = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        self.conv2d3 = nn.Conv2d(channels, channels, 3, stride=2, padding=1)
        freq_bins = post_conv_length(config.num_mel_bins)
        self.conv_out = nn.Linear(channels * freq_bins, config.d_model, bias=False)
        self.layers = [EncoderLayer(config) for _ in range(config.layers)]
        self.ln_post = nn.LayerNorm(config.d_model)
        self._positions = sinusoid_table(max(config.tokens_per_full_chunk, 16), config.d_model)

    def __call__(self, mel: np.ndarray) -> mx.array:
        """``mel``: [num_mel_bins, frames] of one audio -> [tokens, d_model]."""
        return self.encode_many([mel])[0]

    def encode_many(self, mels: list[np.ndarray]) -> list[mx.array]:
        """Several audios in one pass: their conv chunks form one batch, their attention windows
        another (windows never cross audios, so batching changes no result)."""
        cfg = self.config
        chunk = cfg.chunk_frames
        pieces, first_chunk, token_counts = [], [], []
        for mel in mels:
            frames = mel.shape[1]
            if frames == 0:
                raise ValueError("cannot encode empty audio")
            count = -(-frames // chunk)
            padded = np.zeros((cfg.num_mel_bins, count * chunk), dtype=np.float32)
            padded[:, :frames] = mel
            first_chunk.append(sum(p.shape[0] for p in pieces))
            pieces.append(padded.reshape(cfg.num_mel_bins, count, chunk).transpose(1, 0, 2))
            token_counts.append(audio_token_count(frames, cfg.n_window))
        # [chunks, mel, time, 1]: MLX convolutions are channels-last
        # compute in the weights' dtype (convolutions are never quantized)
        x = mx.array(np.concatenate(pieces)[..., None]).astype(self.conv2d1.weight.dtype)
        x = nn.gelu(self.conv2d1(x))
        x = nn.gelu(self.conv2d2(x))
        x = nn.gelu(self.conv2d3(x))
        chunks, freq, steps, channels = x.shape
        x = self.conv_out(x.transpose(0, 2, 3, 1).reshape(chunks, steps, channels * freq))
        x = (x + self._positions[:steps].astype(x.dtype)).reshape(chunks * steps, -1)

        # lay each audio's tokens out in attention windows; padding rows are masked as keys
        window = cfg.window_tokens
        rows, valid, starts = [], [], []
        for first, tokens in zip(first_chunk, token_counts, strict=True):
            windows = -(-tokens // window)
            starts.append(len(rows))
            position = np.arange(windows * window)
            rows.extend(np.where(position < tokens, first * steps + position, 0))
            valid.extend(position < tokens)
        x = x[mx.array(np.asarray(rows, dtype=np.int32))]
        valid = np.asarray(valid).reshape(-1, window)
        mask = None if valid.all() else mx.array(valid)[:, None, None, :]
        for layer in self.layers:
            x = layer(x, (valid.shape[0], window), mask)
        x = self.ln_post(x)
        return [x[start : start + tokens] for start, tokens in zip(starts, token_counts, strict=True)]


class Projector(nn.Module):
    """Encoder width -> decoder width: linear, GELU, linear."""

    def __init__(self, config: EncoderConfig):
        super().__init__()
        self.linear_1 = nn.Linear(config.d_model, config.d_model)
        self.linear_2 = nn.Linear(config.d_model, config.output_dim)

    def __call__(self, x: mx.array) -> mx.array:
        return self.linear_2(nn.gelu(self.linear_1(x)))
