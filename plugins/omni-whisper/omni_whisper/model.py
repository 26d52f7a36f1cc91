"""Whisper encoder and decoder in plain torch, with Hugging Face parameter names.

The decoder runs on caller-owned caches so one forward serves many sequences at once: each row
of a batch has its own self-attention cache length (``start``) and its own cross-attention keys
and values, computed once per sequence from the encoder output (``cross_kv``).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import WhisperConfig

# cuDNN's attention builds an execution plan on the host for every new shape: 10-15 ms a call on
# the H200's host, and a decode step's key span grows by one each step. The decoder's masked
# self-attention takes the memory-efficient kernel on CUDA instead (docs/families/whisper.md, GPU).
DECODER_SDPA_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, weights_out: list | None = None) -> torch.Tensor:
    """Attention of a few decoder queries over a window's 1500 encoder positions, as two batched
    matmuls. SDPA's CPU flash kernel tiles over queries and is slow for one query per row (~5x in
    bfloat16, measured); the softmax runs in float32 whatever the cache dtype. ``weights_out``
    receives the attention weights [B, H, T, S] (word timestamps read them)."""
    weights = (torch.matmul(q, k.transpose(-1, -2)).float() * (q.shape[-1] ** -0.5)).softmax(dim=-1)
    if weights_out is not None:
        weights_out.append(weights)
    return torch.matmul(weights.to(v.dtype), v)


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj = nn.Linear(dim, dim)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def split(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, D] -> [B, H, T, hd]
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def merge(self, x: torch.Tensor) -> torch.Tensor:  # [B, H, T, hd] -> [B, T, D]
        return self.out_proj(x.transpose(1, 2).flatten(2))


class EncoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        dim = config.d_model
        self.self_attn = Attention(dim, config.encoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        attn = self.self_attn
        h = self.self_attn_layer_norm(x)
        q, k, v = attn.split(attn.q_proj(h)), attn.split(attn.k_proj(h)), attn.split(attn.v_proj(h))
        x = x + attn.merge(F.scaled_dot_product_attention(q, k, v))
        return x + self.fc2(F.gelu(self.fc1(self.final_layer_norm(x))))


class Encoder(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        dim = config.d_model
        self.conv1 = nn.Conv1d(config.num_mel_bins, dim, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size=3, stride=2, padding=1)
        self.embed_positions = nn.Embedding(config.max_source_positions, dim)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.encoder_layers))
        self.layer_norm = nn.LayerNorm(dim)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """``mel`` [B, n_mels, 2 * positions] -> hidden states [B, positions, d_model]."""
        x = F.gelu(self.conv2(F.gelu(self.conv1(mel)))).transpose(1, 2)
        x = x + self.embed_positions.weight[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        return self.layer_norm(x)


class DecoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        dim = config.d_model
        self.self_attn = Attention(dim, config.decoder_attention_heads)
        self.self_attn_layer_norm = nn.LayerNorm(dim)
        self.encoder_attn = Attention(dim, config.decoder_attention_heads)
        self.encoder_attn_layer_norm = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, config.decoder_ffn_dim)
        self.fc2 = nn.Linear(config.decoder_ffn_dim, dim)
        self.final_layer_norm = nn.LayerNorm(dim)


class Decoder(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        dim = config.d_model
        self.embed_tokens = nn.Embedding(config.vocab_size, dim)
        self.embed_positions = nn.Embedding(config.max_target_positions, dim)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.decoder_layers))
        self.layer_norm = nn.LayerNorm(dim)
        self.proj_out: nn.Module | None = None  # set by int8 quantisation; else the tied embedding

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self.proj_out is not None:
            return self.proj_out(x)
        return x @ self.embed_tokens.weight.t()

    def cross_kv(self, encoded: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, the cross-attention keys and values [B, H, S, hd]; computed once per sequence."""
        out = []
        for layer in self.layers:
            attn = layer.encoder_attn
            out.append((attn.split(attn.k_proj(encoded)), attn.split(attn.v_proj(encoded))))
        return out

    def forward(
        self,
        tokens: torch.Tensor,
        start: torch.Tensor,
        self_kv: list[tuple[torch.Tensor, torch.Tensor]],
        cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
        span: int | None = None,
        cross_weights: list | None = None,
    ) -> torch.Tensor:
        """Logits of each row's last token.

        ``tokens`` [B, T] continue each row's sequence at position ``start[b]``; their keys and
        values are written into ``self_kv`` (per layer [B, H, capacity, hd]) at those positions.
        Either every row feeds one token (decode, T == 1) or a single row feeds several (prefill).
        ``span``: cache positions the queries look at (masked past each row's own); by default
        the longest row's, read from ``start`` (a sync with the device; a CUDA graph passes it).
        ``cross_weights``: receives each layer's cross-attention weights [B, H, T, S].
        """
        batch, count = tokens.shape
        device = tokens.device
        positions = start[:, None] + torch.arange(count, device=device)  # [B, T]
        span = span or int(start.max()) + count
        x = self.embed_tokens(tokens) + self.embed_positions(positions)
        # a query attends to its own row's keys up to its own position
        mask = (torch.arange(span, device=device)[None, None, :] <= positions[:, :, None]).unsqueeze(1)  # [B, 1, T, span]
        rows = torch.arange(batch, device=device)
        first = int(start[0]) if count > 1 else 0  # prefill: one row, a contiguous run of positions
        with sdpa_kernel(DECODER_SDPA_BACKENDS) if device.type == "cuda" else contextlib.nullcontext():
            for layer, (cache_k, cache_v), (cross_k, cross_v) in zip(self.layers, self_kv, cross_kv, strict=True):
                attn = layer.self_attn
                h = layer.self_attn_layer_norm(x)
                q, k, v = attn.split(attn.q_proj(h)), attn.split(attn.k_proj(h)), attn.split(attn.v_proj(h))
                if count == 1:
                    cache_k[rows, :, start] = k[:, :, 0]
                    cache_v[rows, :, start] = v[:, :, 0]
                else:
                    cache_k[:, :, first : first + count] = k
                    cache_v[:, :, first : first + count] = v
                y = F.scaled_dot_product_attention(q, cache_k[:, :, :span], cache_v[:, :, :span], attn_mask=mask)
                x = x + attn.merge(y)
                cross = layer.encoder_attn
                h = layer.encoder_attn_layer_norm(x)
                y = cross_attention(cross.split(cross.q_proj(h)), cross_k, cross_v, cross_weights)
                x = x + cross.merge(y)
                x = x + layer.fc2(F.gelu(layer.fc1(layer.final_layer_norm(x))))
        return self.logits(self.layer_norm(x[:, -1]))


class WhisperModel(nn.Module):
    def __init__(self, config: WhisperConfig):
        super().__init__()
        self.config = config
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)

    @classmethod
    def from_checkpoint(cls, checkpoint, dtype: torch.dtype = torch.float32) -> WhisperModel:
        model = cls(checkpoint.config)
        state = {k.removeprefix("model."): v for k, v in checkpoint.state_dict.items() if k != "proj_out.weight"}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(f"checkpoint does not match Whisper: missing {missing[:5]}, unexpected {unexpected[:5]}")
        return model.to(dtype).eval()

    def quantize_int8(self) -> WhisperModel:
        """int8 weights (per output channel) for every linear layer and the output projection;
        activations, attention and the rest stay float32 (see ``int8.py``)."""
        from omni_whisper.int8 import Int8Linear, quantize_linears

        if self.decoder.embed_tokens.weight.dtype != torch.float32:
            raise ValueError("int8 quantisation starts from a float32 model")
        quantize_linears(self.encoder)
        quantize_linears(self.decoder)
        self.decoder.proj_out = Int8Linear(self.decoder.embed_tokens.weight, None)
        return self

    def new_self_cache(self, batch: int, capacity: int | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        config = self.config
        heads = config.decoder_attention_heads
        shape = (batch, heads, capacity or config.max_target_positions, config.d_model // heads)
        weight = self.decoder.embed_tokens.weight
        return [(weight.new_zeros(shape), weight.new_zeros(shape)) for _ in self.decoder.layers]

    def decode_sequence(self, tokens: list[int], cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
                        cross_weights: list | None = None) -> torch.Tensor:
        """Logits [1, V] after ``tokens`` fed at once, from position 0, into a fresh cache, over one
        window's cross-attention K/V (``Decoder.cross_kv``: each [1, H, S, hd]); ``cross_weights``
        as in ``Decoder.forward``. A one-off pass (language detection, word timing)."""
        device = cross_kv[0][0].device
        with torch.inference_mode():
            return self.decoder(
                torch.tensor([tokens], device=device),
                torch.zeros(1, dtype=torch.long, device=device),
                self.new_self_cache(1, capacity=len(tokens)),
                cross_kv,
                cross_weights=cross_weights,
            )
