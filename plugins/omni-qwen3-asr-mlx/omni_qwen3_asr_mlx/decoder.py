"""The Qwen3 decoder (q/k RMSNorm, grouped KV heads, rotary positions) in MLX.

``Decoder.__call__`` runs a batch of rows over a ``BatchKVCache``: prefill with several tokens,
decode with one token per row. Each row has its own rotary offset, so rows of different lengths
decode together.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from .config import DecoderConfig
from .kv_cache import BatchKVCache


class Attention(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.scale = cfg.head_dim**-0.5
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(cfg.head_dim, eps=cfg.rms_norm_eps)

    def __call__(self, x, shape, cache: BatchKVCache, layer: int, offsets: mx.array, mask) -> mx.array:
        batch, length = shape
        cfg = self.cfg
        q = self.q_norm(self.q_proj(x).reshape(batch, length, cfg.heads, cfg.head_dim))
        k = self.k_norm(self.k_proj(x).reshape(batch, length, cfg.kv_heads, cfg.head_dim))
        v = self.v_proj(x).reshape(batch, length, cfg.kv_heads, cfg.head_dim)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        q = mx.fast.rope(q, cfg.head_dim, traditional=False, base=cfg.rope_theta, scale=1.0, offset=offsets)
        k = mx.fast.rope(k, cfg.head_dim, traditional=False, base=cfg.rope_theta, scale=1.0, offset=offsets)
        keys, values = cache.update(layer, k, v)
        out = mx.fast.scaled_dot_product_attention(q, keys, values, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(batch * length, -1))


class MLP(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(self, x, shape, cache, layer, offsets, mask):
        x = x + self.self_attn(self.input_layernorm(x), shape, cache, layer, offsets, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig, tie_word_embeddings: bool):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = [DecoderLayer(cfg) for _ in range(cfg.layers)]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.tied = tie_word_embeddings
        if not tie_word_embeddings:
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def new_cache(self, batch: int) -> BatchKVCache:
        return BatchKVCache(self.cfg.layers, batch, self.cfg.kv_heads, self.cfg.head_dim)

    def prefill(self, prompts: list[mx.array]) -> tuple[mx.array, BatchKVCache]:
        """Prompts ([1, n_i, hidden] each) in one left-padded pass: last logits and their cache."""
        lengths = [p.shape[1] for p in prompts]
        longest = max(lengths)
        cache = BatchKVCache.for_prompts(self.cfg.layers, lengths, self.cfg.kv_heads, self.cfg.head_dim)
        rows = [
            mx.concatenate([mx.zeros((1, longest - p.shape[1], p.shape[2]), dtype=p.dtype), p], axis=1)
            if p.shape[1] < longest else p
            for p in prompts
        ]
        return self(mx.concatenate(rows), cache), cache

    def __call__(self, embeddings: mx.array, cache: BatchKVCache, last_only: bool = True) -> mx.array:
        """``embeddings``: [rows, tokens, hidden] appended after each row's cached tokens.
        Returns logits, for the last position only unless ``last_only`` is False."""
        batch, length, hidden = embeddings.shape
        offsets = cache.row_lengths()
        mask = cache.attention_mask(length)
        # rows x tokens flattened: every projection is one matrix product, not one per row
        x = embeddings.reshape(batch * length, hidden)
        for index, layer in enumerate(self.layers):
            x = layer(x, (batch, length), cache, index, offsets, mask)
        cache.advance(length)
        x = x.reshape(batch, length, hidden)
        if last_only:
            x = x[:, -1:, :]
        x = self.norm(x)
        return self.embed_tokens.as_linear(x) if self.tied else self.lm_head(x)
