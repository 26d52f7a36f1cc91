"""Qwen3-Omni's code predictor (``talker.code_predictor.*``): after each talker step, the residual
codebooks' codes of that frame.

A small dense Qwen3 decoder (per-head q/k norms, rotary positions) that starts from two rows, the
talker's last hidden state and the embedding of the talker's code (codebook 0), and then emits one
code per residual codebook: head ``g`` reads codebook ``g + 1``, and its code, embedded by that
codebook's table, is the next input. Every request of a talker step runs in lock-step (the same
number of steps each), so the cache is one contiguous tensor per call, no paging: row ``b``'s
position ``p`` is slot ``b * groups + p``.

With ``fused`` (CUDA, where triton imports) a layer runs the core's fused kernels: the residual
add inside each norm, rotary and the cache write in one kernel, SiLU-gating in one. A frame's 15
passes of 5 layers are launch-bound at any batch (one CUDA graph replay still runs each kernel),
so fewer kernels is what makes them faster.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from omni_core.models import kernels
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

    def forward(self, x: torch.Tensor, step: Step, cache: tuple[torch.Tensor, torch.Tensor], fused: bool) -> torch.Tensor:
        """x [B * n, H]: each row's n new positions; ``cache`` (k, v) [B * slots, kv_heads, d]."""
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        q = self.q_norm(q.reshape(t, self.heads, self.head_dim))
        k = self.k_norm(k.reshape(t, self.kv_heads, self.head_dim))
        v = v.reshape(t, self.kv_heads, self.head_dim)
        k_cache, v_cache = cache
        cos, sin = step.rope
        if fused:
            kernels.rotary_store_kv(q, k, v, cos, sin, k_cache, v_cache, step.slots)
        else:
            q, k = apply_rotary(q, k, step.rope)
            k_cache[step.slots], v_cache[step.slots] = k, v
        b, n, seen = step.batch, step.new, step.start + step.new
        q = q.reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        keys = k_cache.view(b, -1, self.kv_heads, self.head_dim)[:, :seen].transpose(1, 2)
        values = v_cache.view(b, -1, self.kv_heads, self.head_dim)[:, :seen].transpose(1, 2)
        out = F.scaled_dot_product_attention(q, keys, values, is_causal=n > 1, enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(t, -1))


class PredictorLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.self_attn = PredictorAttention(config)
        self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, step: Step, cache, fused: bool):
        """Returns (this layer's MLP output, the residual stream before it): their sum is the
        layer's output, added by the next norm (in its kernel, when fused)."""
        if residual is None:
            h, residual = self.input_layernorm(x, fused=fused), x
        else:
            h, residual = self.input_layernorm(x, residual, fused=fused)
        h = self.self_attn(h, step, cache, fused)
        h, residual = self.post_attention_layernorm(h, residual, fused=fused)
        return self.mlp(h, fused=fused), residual


@dataclass(frozen=True)
class Step:
    """One pass over ``new`` positions from ``start`` for ``batch`` rows: their rotary rows and cache slots."""

    batch: int
    start: int
    new: int
    rope: tuple[torch.Tensor, torch.Tensor]
    slots: torch.Tensor


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
        # (batch, start, new, device, dtype) -> Step: made once, so a captured graph reads them
        # instead of recomputing them in a dozen small kernels every replay
        self._steps: dict[tuple, Step] = {}

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
            step = self._step(b, start, n, x)
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

    def _step(self, batch: int, start: int, new: int, like: torch.Tensor) -> Step:
        key = (batch, start, new, like.device, like.dtype)
        if key not in self._steps:
            positions = torch.arange(start, start + new, device=like.device).repeat(batch)
            slots = (torch.arange(batch, device=like.device) * self.groups)[:, None] + torch.arange(start, start + new, device=like.device)
            self._steps[key] = Step(batch, start, new, self.model.rotary.table(positions, like.dtype), slots.reshape(-1))
        return self._steps[key]
