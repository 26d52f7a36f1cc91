"""An S2-Pro checkpoint directory: its files, and the slow and fast ARs loaded from the
safetensors under the official key names.

Layout: config.json (model type ``fish_qwen3_omni``), model.safetensors (or shards with
model.safetensors.index.json), tokenizer.json (+ tokenizer_config.json), codec.pth.

Key names: ``text_model.model.`` holds the slow AR (``embeddings``, ``layers.N.attention.{wqkv,
wo, q_norm, k_norm}``, ``layers.N.attention_norm``, ``layers.N.feed_forward.{w1, w2, w3}``,
``layers.N.ffn_norm``, ``norm``, and ``output`` when the embeddings are not tied);
``audio_decoder.`` holds the fast AR under the same layer names (plus ``embeddings``,
``output``, ``norm``, ``project_in``) and, as ``audio_decoder.codebook_embeddings``, the slow
AR's code embeddings. ``wqkv`` is q|k|v fused; its q and k rows (and the q/k norms) are
reordered for the core's rotary as they load (``rotary_pairs``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from omni_core.models import iter_safetensors, load_weights

from .config import FishConfig, load_config, token_ids
from .fast_ar import FastAR
from .random_weights import build_random, random_settings
from .rotary_pairs import fused_qkv_to_halves, norm_to_halves
from .slow_ar import SlowAR

SLOW, FAST = "text_model.model.", "audio_decoder."
CODEBOOK_EMBEDDINGS = "audio_decoder.codebook_embeddings.weight"
REQUIRED_FILES = ("config.json", "tokenizer.json", "codec.pth")

# the slow AR's layer names -> the core backbone's (w1 is the gated half of the MLP, w3 the other)
_SLOW_LAYER_NAMES = {
    "attention.wqkv": "self_attn.qkv_proj",
    "attention.wo": "self_attn.o_proj",
    "attention.q_norm": "self_attn.q_norm",
    "attention.k_norm": "self_attn.k_norm",
    "attention_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "feed_forward.w1": "mlp.gate_proj",
    "feed_forward.w3": "mlp.up_proj",
    "feed_forward.w2": "mlp.down_proj",
}


def check_layout(checkpoint_dir: str) -> None:
    root = Path(checkpoint_dir)
    drawn = random_settings(root) is not None  # weights drawn at load: no model.safetensors, no codec.pth
    missing = [
        name for name in REQUIRED_FILES if not (root / name).exists() and not (drawn and name == "codec.pth")
    ]
    if not list(root.glob("*.safetensors")) and not drawn:
        missing.append("model.safetensors")
    if missing:
        raise FileNotFoundError(f"{root} is not an S2-Pro checkpoint: missing {', '.join(missing)}")
    load_config(str(root))


def _to_halves(name: str, tensor: torch.Tensor, sizes) -> torch.Tensor:
    """The rotary reordering of the tensors it applies to (``rotary_pairs``)."""
    if ".attention.wqkv." in f".{name}":
        return fused_qkv_to_halves(tensor, sizes.n_head, sizes.n_local_heads, sizes.head_dim)
    if name.endswith(("attention.q_norm.weight", "attention.k_norm.weight")):
        return norm_to_halves(tensor)
    return tensor


def slow_weights(
    weights: Iterator[tuple[str, torch.Tensor]], cfg: FishConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The slow AR's tensors under the core backbone's names."""
    for name, tensor in weights:
        if name == CODEBOOK_EMBEDDINGS:
            yield "codebook_embeddings.weight", tensor
            continue
        if not name.startswith(SLOW):
            continue
        name = name[len(SLOW) :]
        tensor = _to_halves(name, tensor, cfg.slow)
        if name == "embeddings.weight":
            yield "model.embed_tokens.weight", tensor
        elif name == "norm.weight":
            yield "model.norm.weight", tensor
        elif name.startswith("output."):
            yield "lm_head." + name[len("output.") :], tensor
        elif name.startswith("layers."):
            _, index, rest = name.split(".", 2)
            module, _, leaf = rest.rpartition(".")
            if module not in _SLOW_LAYER_NAMES:
                raise KeyError(f"{SLOW}{name}: not a tensor of the slow AR")
            yield f"model.layers.{index}.{_SLOW_LAYER_NAMES[module]}.{leaf}", tensor
        else:
            raise KeyError(f"{SLOW}{name}: not a tensor of the slow AR")


def fast_weights(
    weights: Iterator[tuple[str, torch.Tensor]], cfg: FishConfig
) -> Iterator[tuple[str, torch.Tensor]]:
    """The fast AR's tensors under its module names (the checkpoint's, without the prefix)."""
    for name, tensor in weights:
        if name.startswith(FAST) and name != CODEBOOK_EMBEDDINGS:
            name = name[len(FAST) :]
            yield name, _to_halves(name, tensor, cfg.fast)


def load_slow_ar(checkpoint_dir: str, device="cpu", dtype=torch.float32) -> SlowAR:
    cfg = load_config(str(checkpoint_dir))
    settings = random_settings(checkpoint_dir)
    if settings is not None:
        model = build_random(lambda: SlowAR(cfg), device, dtype, settings)
    else:
        model = SlowAR(cfg)
        load_weights(model, slow_weights(iter_safetensors(checkpoint_dir), cfg))
        model = model.to(device=device, dtype=dtype).eval()
    model.allow_only(token_ids(str(checkpoint_dir), cfg.codebook_size))
    return model


def load_fast_ar(checkpoint_dir: str, device="cpu", dtype=torch.float32) -> FastAR:
    cfg = load_config(str(checkpoint_dir))
    settings = random_settings(checkpoint_dir)
    if settings is not None:
        return build_random(lambda: FastAR(cfg), device, dtype, settings)
    model = FastAR(cfg)
    load_weights(model, fast_weights(iter_safetensors(checkpoint_dir, FAST), cfg))
    return model.to(device=device, dtype=dtype).eval()
