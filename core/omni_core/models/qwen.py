"""Qwen2 / Qwen3 / Qwen3-MoE (and Qwen2-MoE) decoders on the paged KV cache.

One backbone covers them: Qwen2 has q/k/v biases; Qwen3 drops them and normalises q and k
per head (``q_norm``, ``k_norm``); Qwen3-MoE swaps the MLP for routed experts in sparse layers.
Module names follow the Hugging Face checkpoints, so official key names load directly (q/k/v and
gate/up are fused at load time, see ``omni_core.models.loader``).

The model follows the engine's ARModel protocol: ``embed(token_ids)``, ``forward(embeds,
positions, ctx)`` and ``compute_logits(hidden)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from omni_core.models import kernels
from omni_core.models.attention import ForwardContext
from omni_core.models.layers import (
    GatedMLP,
    PackedLinear,
    RMSNorm,
    RotaryEmbedding,
    mrope_settings,
    rope_theta,
)
from omni_core.models.logits_head import LogitsHead
from omni_core.models.moe import SparseMoeBlock


@dataclass(frozen=True)
class KVCacheSpec:
    """What the engine needs to size a model's paged KV cache."""

    num_layers: int
    num_kv_heads: int
    head_dim: int


class QwenAttention(nn.Module):
    def __init__(self, config, layer_index: int, qk_norm: bool, bias: bool):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.qkv_proj = PackedLinear(config.hidden_size, [q_size, kv_size, kv_size], bias=bias)
        self.o_proj = nn.Linear(q_size, config.hidden_size, bias=False)
        self.splits = [q_size, kv_size, kv_size]
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        # the fused decode projection (kernels.qkv_rotary_store) has no per-head q/k norm
        self.fuses_decode = not qk_norm and kernels.fuses_qkv_rotary(self.head_dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], ctx: ForwardContext) -> torch.Tensor:
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        out = ctx.attention(self.layer_index, q, k, v, rope=rope)
        return self.o_proj(out.reshape(T, -1))

    def forward_decode(self, x, residual, norm: RMSNorm, rope, ctx: ForwardContext):
        """Decode rows with the fused kernels: norm (after the residual add) + q/k/v projection +
        rotary + cache write in one kernel, attention over the cache, then o_proj. Returns
        (o_proj output, residual stream)."""
        T = x.shape[0]
        k_cache, v_cache = ctx.kv_caches[self.layer_index]
        cos, sin, *positions = rope  # (cos rows, sin rows) or (cos table, sin table, positions)
        out = kernels.qkv_rotary_store(
            x, self.qkv_proj.weight, self.qkv_proj.bias, cos, sin, ctx.meta.slot_mapping, k_cache, v_cache,
            self.num_heads, self.num_kv_heads, self.head_dim, residual=residual, norm_weight=norm.weight, eps=norm.eps,
            positions=positions[0] if positions else None,
        )
        q, residual = out if residual is not None else (out, x)
        attn = ctx.backend.attend_cached(q.view(T, self.num_heads, self.head_dim), k_cache, v_cache, ctx.meta, self.head_dim**-0.5)
        return kernels.skinny_linear(attn.reshape(T, -1), self.o_proj.weight), residual


class QwenDecoderLayer(nn.Module):
    def __init__(self, config, layer_index: int, qk_norm: bool, bias: bool, sparse: bool):
        super().__init__()
        self.self_attn = QwenAttention(config, layer_index, qk_norm, bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        if sparse:
            self.mlp = SparseMoeBlock(
                config.hidden_size,
                config.num_experts,
                config.num_experts_per_tok,
                config.moe_intermediate_size,
                getattr(config, "norm_topk_prob", False),
                getattr(config, "shared_expert_intermediate_size", 0) or 0,
            )
        else:
            self.mlp = GatedMLP(config.hidden_size, config.intermediate_size)

    def forward(self, x, residual, rope, ctx):
        """Returns (this layer's last block output, the residual stream): the layer's output is
        their sum, left to the next norm, which adds it (one fused kernel on the fused path)."""
        fused = ctx.fused_ops
        decode_kernels = ctx.fused_decode_rows
        if decode_kernels and self.self_attn.fuses_decode:
            x, residual = self.self_attn.forward_decode(x, residual, self.input_layernorm, rope, ctx)
        else:
            if residual is None:
                residual = x
                x = self.input_layernorm(x, fused=fused)
            else:
                x, residual = self.input_layernorm(x, residual, fused=fused)
            x = self.self_attn(x, rope, ctx)
        if decode_kernels and isinstance(self.mlp, GatedMLP):
            return self.mlp.forward_rows(x, residual, self.post_attention_layernorm)
        x, residual = self.post_attention_layernorm(x, residual, fused=fused)
        return self.mlp(x, fused=fused), residual


class QwenModel(nn.Module):
    def __init__(self, config, qk_norm: bool, bias: bool, moe: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        layers = []
        for i in range(config.num_hidden_layers):
            sparse = moe and _is_sparse_layer(config, i)
            layers.append(QwenDecoderLayer(config, i, qk_norm, bias, sparse))
        self.layers = nn.ModuleList(layers)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        head_dim = layers[0].self_attn.head_dim
        section, interleaved = mrope_settings(config)
        self.rotary = RotaryEmbedding(head_dim, config.max_position_embeddings, rope_theta(config), section, interleaved)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext, layer_inputs: dict | None = None) -> torch.Tensor:
        """``positions`` [T], or [axes, T] for a multimodal rotary. ``layer_inputs`` {i: (rows,
        values)} adds ``values`` to the output of layer ``i`` at packed ``rows`` (Qwen3-VL's and
        Qwen3-Omni's deepstack visual features), after that output is captured, as Hugging Face
        records it."""
        x = embeds
        ctx.capture(0, x)
        if ctx.fused_decode_rows and self.layers[0].self_attn.fuses_decode and positions.dim() == 1:
            # every layer's fused q/k/v kernel looks its rows up in the tables: no gather kernels
            rope = (self.rotary.cos, self.rotary.sin, positions)
        else:
            rope = self.rotary.table(positions, x.dtype)
        last = len(self.layers)
        residual = None
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, rope, ctx)
            if i + 1 < last and i + 1 in ctx.capture_layers:
                ctx.capture(i + 1, x + residual)
            if layer_inputs and i in layer_inputs:
                # the layer's output is x + residual: summed here in Hugging Face's order, the
                # features added to it, and carried on as the residual (0 + r is exact)
                rows, values = layer_inputs[i]
                residual = (x + residual).index_add_(0, rows, values.to(x.dtype))
                x = torch.zeros_like(x)
        x, _ = self.norm(x, residual, fused=ctx.fused_ops)
        ctx.capture(last, x)  # the last entry is after the final norm, as in Hugging Face's hidden_states
        return x


def _is_sparse_layer(config, index: int) -> bool:
    if index in (getattr(config, "mlp_only_layers", None) or []):
        return False
    step = getattr(config, "decoder_sparse_step", 1) or 1
    return config.num_experts > 0 and (index + 1) % step == 0


class QwenForCausalLM(nn.Module):
    """Decoder + LM head. ``qk_norm``/``bias``/``moe`` select the Qwen2, Qwen3 or Qwen3-MoE layout."""

    qk_norm = False
    bias = True
    moe = False

    def __init__(self, config):
        super().__init__()
        if getattr(config, "use_sliding_window", False):
            raise NotImplementedError("sliding-window attention is not supported by the shared backbones")
        self.config = config
        self.model = QwenModel(config, self.qk_norm, self.bias, self.moe)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self._head = LogitsHead()
        self._decode_step = (None, None)  # (caches it was built for, kernels.decode_step kernel or None)
        attn = self.model.layers[0].self_attn
        self.kv_cache_spec = KVCacheSpec(config.num_hidden_layers, attn.num_kv_heads, attn.head_dim)
        axes = self.model.rotary.axes
        self.rope_axes = 1 if axes is None else int(axes.max()) + 1  # position axes the rotary reads (M-RoPE: 3)
        # MoE layers run in graphs through the fused kernels (kernels.fused_moe), which need triton
        self.supports_cuda_graphs = not self.moe or kernels.triton_available()

    @property
    def hidden_size(self) -> int:
        return self.config.hidden_size

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(token_ids)

    def forward(self, embeds: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        if embeds.shape[0] == 1 and ctx.fused_decode_rows and not ctx.capture_layers:
            step = self._decode_step_kernel(ctx)
            if step is not None:  # one sequence's decode forward in one kernel (kernels.decode_step)
                return step(embeds, positions, ctx.meta)
        return self.model(embeds, positions, ctx)

    def _decode_step_kernel(self, ctx: ForwardContext):
        """The one-kernel batch-1 decode forward over these caches, built on first use; None
        where it does not apply (the per-layer kernels run)."""
        enabled = kernels.decode_step_enabled()
        key = (ctx.kv_caches[0][0].data_ptr(), ctx.meta.block_size, enabled)
        if self._decode_step[0] != key:
            built = kernels.decode_step_kernel(self, ctx.kv_caches, ctx.meta.block_size, ctx.kv_caches[0][0].device) if enabled else None
            self._decode_step = (key, built)
        return self._decode_step[1]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return self._head(hidden, weight)


class Qwen2ForCausalLM(QwenForCausalLM):
    qk_norm, bias, moe = False, True, False


class Qwen3ForCausalLM(QwenForCausalLM):
    qk_norm, bias, moe = True, False, False

    def __init__(self, config):
        self.bias = bool(getattr(config, "attention_bias", False))
        super().__init__(config)


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    qk_norm, moe = True, True


class Qwen2MoeForCausalLM(QwenForCausalLM):
    """Qwen2-MoE: q/k/v biases (``qkv_bias``), routed experts plus a sigmoid-gated shared expert."""

    qk_norm, moe = False, True

    def __init__(self, config):
        self.bias = bool(getattr(config, "qkv_bias", True))
        super().__init__(config)
