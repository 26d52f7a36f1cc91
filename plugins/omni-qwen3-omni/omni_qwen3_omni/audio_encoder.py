"""Qwen3-Omni's audio encoder (``thinker.audio_tower``): log-mel in, one embedding per ~80 ms out.

Each clip's features are cut into chunks of ``2 * n_window`` frames (100: one second); three
stride-2 3x3 convolutions (GELU) take a chunk to 13 rows, flattened over channels x mel bins and
projected (``conv_out``); sinusoidal positions restart in every chunk. Transformer layers
(pre-LayerNorm, GELU FFN) attend within windows of ``n_window_infer // (2 * n_window)`` chunks
(800 frames: 104 rows), never across clips; then ``ln_post``, ``proj1``, GELU, ``proj2`` to the
thinker's width. Clips of several requests run as one batch: their chunks form one convolution
batch and their windows one padded attention call per layer.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def output_length(frames: int, n_window: int) -> int:
    """Rows the encoder gives for ``frames`` mel frames (what the prompt's placeholder count is)."""
    chunk = 2 * n_window
    tail = frames % chunk
    return (_chunk_rows(tail) if tail else 0) + (frames // chunk) * _chunk_rows(chunk)


def _chunk_rows(frames: int) -> int:
    """Rows of one chunk: three stride-2 convolutions."""
    for _ in range(3):
        frames = (frames - 1) // 2 + 1
    return frames


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> torch.Tensor:
    increment = np.log(max_timescale) / (channels // 2 - 1)
    inv = torch.exp(-increment * torch.arange(channels // 2).float())
    scaled = torch.arange(length)[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


class AudioAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(d, d)
        self.k_proj = nn.Linear(d, d)
        self.v_proj = nn.Linear(d, d)
        self.out_proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """x [windows, W, d]; mask [windows, 1, 1, W] (True: a real row) or None."""
        n, w, d = x.shape
        shape = (n, w, self.heads, d // self.heads)
        q, k, v = (proj(x).view(shape).transpose(1, 2) for proj in (self.q_proj, self.k_proj, self.v_proj))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out_proj(out.transpose(1, 2).reshape(n, w, d))


class AudioEncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.self_attn = AudioAttention(d, heads)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, ffn)
        self.fc2 = nn.Linear(ffn, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.self_attn_layer_norm(x), mask)
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    """Module names follow the checkpoint (``thinker.audio_tower.*``)."""

    def __init__(self, config):
        super().__init__()
        d, ch = config.d_model, config.downsample_hidden_size
        self.n_window = config.n_window
        self.windows_per_attention = max(1, config.n_window_infer // (2 * config.n_window))
        self.conv2d1 = nn.Conv2d(1, ch, 3, 2, padding=1)
        self.conv2d2 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        self.conv2d3 = nn.Conv2d(ch, ch, 3, 2, padding=1)
        freq = (((config.num_mel_bins + 1) // 2 + 1) // 2 + 1) // 2
        self.conv_out = nn.Linear(ch * freq, d, bias=False)
        self.layers = nn.ModuleList(
            AudioEncoderLayer(d, config.encoder_attention_heads, config.encoder_ffn_dim) for _ in range(config.encoder_layers)
        )
        self.ln_post = nn.LayerNorm(d)
        self.proj1 = nn.Linear(d, d)
        self.proj2 = nn.Linear(d, config.output_dim)
        self.register_buffer("positions", sinusoids(config.max_source_positions, d), persistent=False)
        if config.activation_function != "gelu":
            raise ValueError(f"audio encoder activation {config.activation_function!r} is not supported (gelu)")

    @property
    def rows_per_window(self) -> int:
        return _chunk_rows(2 * self.n_window) * self.windows_per_attention

    @torch.inference_mode()
    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        """``features``: each clip's log-mel [n_mels, frames] -> each clip's embeddings [rows, out]."""
        dtype, device = self.conv_out.weight.dtype, self.conv_out.weight.device
        chunk = 2 * self.n_window
        pieces, lengths = [], []
        for mel in features:
            for part in mel.split(chunk, dim=1):
                pieces.append(part)
                lengths.append(part.shape[1])
        padded = torch.zeros(len(pieces), 1, features[0].shape[0], max(lengths), dtype=dtype, device=device)
        for i, part in enumerate(pieces):
            padded[i, 0, :, : part.shape[1]] = part.to(device, dtype)
        x = F.gelu(self.conv2d1(padded))
        x = F.gelu(self.conv2d2(x))
        x = F.gelu(self.conv2d3(x))
        b, c, f, t = x.shape
        x = self.conv_out(x.permute(0, 3, 1, 2).reshape(b, t, c * f))
        x = x + self.positions[:t].to(x.dtype)
        rows = [_chunk_rows(n) for n in lengths]
        flat = torch.cat([x[i, :r] for i, r in enumerate(rows)])  # the chunks' valid rows, clip after clip
        clip_rows = [output_length(mel.shape[1], self.n_window) for mel in features]
        windows = self._windows(clip_rows)
        hidden = self._attend(flat, windows)
        hidden = self.proj2(F.gelu(self.proj1(self.ln_post(hidden))))
        return list(hidden.split(clip_rows))

    def _windows(self, clip_rows: list[int]) -> list[int]:
        """Attention windows' lengths, clip after clip: full windows, then each clip's rest."""
        size = self.rows_per_window
        out = []
        for rows in clip_rows:
            out += [size] * (rows // size) + ([rows % size] if rows % size else [])
        return out

    def _attend(self, flat: torch.Tensor, windows: list[int]) -> torch.Tensor:
        width = max(windows)
        d = flat.shape[1]
        starts = np.concatenate([[0], np.cumsum(windows)[:-1]])
        # one padded batch of windows: row j of window i is flat row starts[i] + j
        index = torch.as_tensor(starts[:, None] + np.arange(width)[None, :], device=flat.device)
        valid = torch.as_tensor(np.arange(width)[None, :] < np.asarray(windows)[:, None], device=flat.device)
        x = flat[index.clamp(max=flat.shape[0] - 1)]
        mask = None if all(w == width for w in windows) else valid[:, None, None, :]
        for layer in self.layers:
            x = layer(x, mask)
        return x[valid].reshape(-1, d)


def feature_frames(samples: int, hop: int) -> int:
    """Mel frames of a clip of ``samples`` samples (the last STFT frame is dropped)."""
    return samples // hop


def audio_rows(samples: int, hop: int, n_window: int) -> int:
    return output_length(feature_frames(samples, hop), n_window)

