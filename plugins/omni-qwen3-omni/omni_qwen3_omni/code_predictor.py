"""Qwen3-Omni's code predictor (``talker.code_predictor.*``): after each talker step, the residual
codebooks' codes of that frame.

A small dense Qwen3 decoder (per-head q/k norms, rotary positions) that starts from two rows, the
talker's last hidden state and the embedding of the talker's code (codebook 0), and then emits one
code per residual codebook: head ``g`` reads codebook ``g + 1``, and its code, embedded by that
codebook's table, is the next input. Every request of a talker step runs in lock-step (the same
number of steps each) over one contiguous cache per call (``omni_core.models.lockstep``, whose
``fused`` path runs the core's fused kernels: a frame's 15 passes of 5 layers are launch-bound).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omni_core.models.layers import GatedMLP, PackedLinear, RMSNorm, RotaryEmbedding, rope_theta
from omni_core.models.lockstep import Pass, Passes, attend, pre_norm_layer
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

    def forward(self, x: torch.Tensor, step: Pass, cache: tuple[torch.Tensor, torch.Tensor], fused: bool) -> torch.Tensor:
        """x [B * n, H]: each row's n new positions; ``cache`` (k, v) [B * slots, kv_heads, d]."""
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        q = self.q_norm(q.reshape(t, self.heads, self.head_dim))
        k = self.k_norm(k.reshape(t, self.kv_heads, self.head_dim))
        return self.o_proj(attend(q, k, v.reshape(t, self.kv_heads, self.head_dim), step, cache, fused))


class PredictorLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = PredictorAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, step: Pass, cache, fused: bool):
        return pre_norm_layer(self.input_layernorm, self.self_attn, self.post_attention_layernorm, self.mlp, x, residual, step, cache, fused)


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
        self.passes = Passes(self.model.rotary, self.groups)

    @torch.inference_mode()
    def forward(self, talker_hidden: torch.Tensor, code0_embed: torch.Tensor, choose: Callable[[torch.Tensor, int], torch.Tensor] | None = None,
                fused: bool = False):
        """``talker_hidden``, ``code0_embed`` [B, H] -> (codes of codebooks 1.. [B, groups - 1],
        the sum of their embeddings [B, H]). ``choose(logits [B, V], group)`` picks each code
        (default: the most likely). ``fused``: run the core's triton kernels (see the module doc)."""
        choose = choose or (lambda logits, group: logits.argmax(-1))
        b, hidden = talker_hidden.shape
        attn = self.model.layers[0].self_attn
        shape = (b * self.groups, attn.kv_heads, attn.head_dim)  # 2 prefill rows + groups - 2 more
        caches = [(talker_hidden.new_empty(shape), talker_hidden.new_empty(shape)) for _ in self.model.layers]
        x = torch.stack([talker_hidden, code0_embed], dim=1).reshape(2 * b, hidden)
        start = 0
        codes, total = [], None
        for group in range(self.groups - 1):
            n = x.shape[0] // b
            step = self.passes.get(b, start, n, x)
            residual = None
            for layer, cache in zip(self.model.layers, caches, strict=True):
                x, residual = layer(x, residual, step, cache, fused)
            last = self.model.norm(x, residual, fused=fused)[0].view(b, n, hidden)[:, -1]
            code = choose(self.lm_head[group](last), group)
            codes.append(code)
            embed = self.model.codec_embedding[group](code)
            total = embed if total is None else total + embed
            start += n
            x = embed
        return torch.stack(codes, dim=1), total
