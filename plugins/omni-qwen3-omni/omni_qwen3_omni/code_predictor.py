"""Qwen3-Omni's code predictor (``talker.code_predictor.*``): after each talker step, the residual
codebooks' codes of that frame.

A small dense Qwen3 decoder (per-head q/k norms, rotary positions) that starts from two rows, the
talker's last hidden state and the embedding of the talker's code (codebook 0), and then emits one
code per residual codebook: head ``g`` reads codebook ``g + 1``, and its code, embedded by that
codebook's table, is the next input. Every request of a talker step runs in lock-step (the same
number of steps each), so the cache is one contiguous tensor per call, no paging.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from omni_core.models.layers import GatedMLP, PackedLinear, RMSNorm, RotaryEmbedding, apply_rotary, rope_theta
from torch import nn


class PredictorAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = PackedLinear(config.hidden_size, [q, kv, kv], bias=bool(getattr(config, "attention_bias", False)))
        self.o_proj = nn.Linear(q, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        self.splits = [q, kv, kv]

    def forward(self, x: torch.Tensor, rope, cache: tuple[torch.Tensor, torch.Tensor], start: int) -> torch.Tensor:
        """x [B, n, H] at positions start..start+n; ``cache`` (k, v) [B, kv_heads, max, d] is written there."""
        b, n, _ = x.shape
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        q = self.q_norm(q.reshape(b * n, self.heads, self.head_dim))
        k = self.k_norm(k.reshape(b * n, self.kv_heads, self.head_dim))
        q, k = apply_rotary(q, k, rope)
        k_cache, v_cache = cache
        k_cache[:, :, start : start + n] = k.reshape(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v_cache[:, :, start : start + n] = v.reshape(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        q = q.reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        keys, values = k_cache[:, :, : start + n], v_cache[:, :, : start + n]
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=n > 1, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, -1))


class PredictorLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = PredictorAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, rope, cache, start):
        x = x + self.self_attn(self.input_layernorm(x), rope, cache, start)
        return x + self.mlp(self.post_attention_layernorm(x))


class PredictorModel(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layers = nn.ModuleList(PredictorLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.codec_embedding = nn.ModuleList(nn.Embedding(config.vocab_size, config.hidden_size) for _ in range(config.num_code_groups - 1))
        head_dim = self.layers[0].self_attn.head_dim
        self.rotary = RotaryEmbedding(head_dim, config.num_code_groups + 1, rope_theta(config))


class CodePredictor(nn.Module):
    """Module names follow the checkpoint (``talker.code_predictor.*``)."""

    def __init__(self, config):
        super().__init__()
        self.groups = config.num_code_groups
        self.model = PredictorModel(config)
        self.lm_head = nn.ModuleList(nn.Linear(config.hidden_size, config.vocab_size, bias=False) for _ in range(self.groups - 1))

    @torch.inference_mode()
    def forward(self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor, choose: Callable[[torch.Tensor, int], torch.Tensor] | None = None):
        """``talker_hidden``, ``code0_embed`` [B, H] -> (codes of codebooks 1.. [B, groups - 1],
        the sum of their embeddings [B, H]). ``choose(logits [B, V], group)`` picks each code
        (default: the most likely)."""
        choose = choose or (lambda logits, group: logits.argmax(-1))
        b = talker_hidden.shape[0]
        attn = self.model.layers[0].self_attn
        steps = self.groups  # 2 prefill rows + groups - 2 more
        shape = (b, attn.kv_heads, steps, attn.head_dim)
        caches = [(talker_hidden.new_empty(shape), talker_hidden.new_empty(shape)) for _ in self.model.layers]
        x = torch.stack([talker_hidden, code0_embed], dim=1)
        start = 0
        codes, total = [], None
        for group in range(self.groups - 1):
            n = x.shape[1]
            positions = torch.arange(start, start + n, device=x.device).repeat(b)
            rope = self.model.rotary.table(positions, x.dtype)
            h = x
            for layer, cache in zip(self.model.layers, caches, strict=True):
                h = layer(h, rope, cache, start)
            logits = self.lm_head[group](self.model.norm(h[:, -1]))
            code = choose(logits, group)
            codes.append(code)
            embed = self.model.codec_embedding[group](code)
            total = embed if total is None else total + embed
            start += n
            x = embed[:, None]
        return torch.stack(codes, dim=1), total
