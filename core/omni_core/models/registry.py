"""Causal LMs the engine can build straight from a checkpoint's ``architectures`` field."""

from __future__ import annotations

from pathlib import Path

import torch

from omni_core.models.loader import iter_safetensors, load_weights, random_init
from omni_core.models.qwen import Qwen2ForCausalLM, Qwen2MoeForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM

ARCHITECTURES = {
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
}


def model_class(config):
    names = getattr(config, "architectures", None) or []
    for name in names:
        if name in ARCHITECTURES:
            return ARCHITECTURES[name]
    raise ValueError(f"unsupported architectures {names}; supported: {sorted(ARCHITECTURES)}")


def build_causal_lm(config, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """An instance of the config's architecture with uninitialised weights, on ``device``."""
    with torch.device(device):
        model = model_class(config)(config)
    return model.to(dtype=dtype).eval()


def load_causal_lm(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Build the checkpoint's model and load its safetensors; ``dtype`` defaults to the config's."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(path))
    if dtype is None:
        dtype = _config_dtype(config)
    model = build_causal_lm(config, device, dtype)
    load_weights(model, iter_safetensors(path))
    return model


def random_causal_lm(config, device="cpu", dtype=torch.float32, seed: int = 0):
    model = build_causal_lm(config, "cpu", torch.float32)
    random_init(model, seed)
    return model.to(device=device, dtype=dtype)


def _config_dtype(config) -> torch.dtype:
    value = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    if isinstance(value, str):
        value = getattr(torch, value)
    return value
