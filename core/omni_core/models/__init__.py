"""Shared model building blocks: paged attention, Qwen2 / Qwen3 / Qwen3-MoE decoders, weight loading."""

from omni_core.models.attention import AttentionBackend, AttentionMetadata, ForwardContext, SdpaBackend
from omni_core.models.loader import WeightLoadError, iter_safetensors, load_weights, random_init
from omni_core.models.paged_backend import TritonPagedBackend, resolve_attention_backend
from omni_core.models.qwen import (
    KVCacheSpec,
    Qwen2ForCausalLM,
    Qwen2MoeForCausalLM,
    Qwen3ForCausalLM,
    Qwen3MoeForCausalLM,
)
from omni_core.models.registry import ARCHITECTURES, build_causal_lm, load_causal_lm, random_causal_lm

__all__ = [
    "ARCHITECTURES",
    "AttentionBackend",
    "AttentionMetadata",
    "ForwardContext",
    "KVCacheSpec",
    "Qwen2ForCausalLM",
    "Qwen2MoeForCausalLM",
    "Qwen3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "SdpaBackend",
    "TritonPagedBackend",
    "WeightLoadError",
    "build_causal_lm",
    "iter_safetensors",
    "load_causal_lm",
    "load_weights",
    "random_causal_lm",
    "random_init",
    "resolve_attention_backend",
]
