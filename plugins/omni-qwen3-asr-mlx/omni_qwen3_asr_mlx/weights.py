"""Checkpoint weights -> the MLX module tree, for every published layout.

Our tree: ``audio_tower.*`` (encoder), ``projector.linear_{1,2}``, ``decoder.*`` (Qwen3 + lm_head).

- transformers (``-hf``): ``model.audio_tower.*``, ``model.multi_modal_projector.linear_{1,2}``,
  ``model.language_model.*``, ``lm_head``.
- original Qwen/Qwen3-ASR: ``thinker.audio_tower.*`` with the projector as
  ``thinker.audio_tower.proj{1,2}``, ``thinker.model.*``, ``thinker.lm_head``.
- MLX conversions: the original names without ``thinker.``, convolutions already channels-last,
  quantized linears as ``weight`` + ``scales`` + ``biases`` (affine, ``quantization`` in config.json).
"""

from __future__ import annotations

import glob
import os
import re

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from .config import ASRConfig

# (pattern, replacement) applied in order; the first match wins
_RENAMES = [
    (r"^(?:thinker\.)?model\.multi_modal_projector\.", "projector."),
    (r"^(?:thinker\.)?audio_tower\.proj1\.", "projector.linear_1."),
    (r"^(?:thinker\.)?audio_tower\.proj2\.", "projector.linear_2."),
    (r"^(?:thinker\.)?model\.audio_tower\.", "audio_tower."),
    (r"^(?:thinker\.)?audio_tower\.", "audio_tower."),
    (r"^(?:thinker\.)?model\.language_model\.", "decoder."),
    (r"^(?:thinker\.)?model\.", "decoder."),
    (r"^(?:thinker\.)?lm_head\.", "decoder.lm_head."),
]
# buffers some exports include; recomputed here
_IGNORED = re.compile(r"(positional_embedding|rotary_emb\.inv_freq)$")


def rename(key: str) -> str | None:
    if _IGNORED.search(key):
        return None
    for pattern, replacement in _RENAMES:
        if re.match(pattern, key):
            return re.sub(pattern, replacement, key, count=1)
    return key


def read_checkpoint(checkpoint_dir: str) -> dict[str, mx.array]:
    files = sorted(glob.glob(os.path.join(checkpoint_dir, "*.safetensors")))
    if not files:
        if glob.glob(os.path.join(checkpoint_dir, "*.bin")) or glob.glob(os.path.join(checkpoint_dir, "*.pt")):
            raise ValueError(f"{checkpoint_dir}: only PyTorch pickles found; convert them to safetensors")
        raise FileNotFoundError(f"{checkpoint_dir}: no *.safetensors weights")
    weights: dict[str, mx.array] = {}
    for path in files:
        for key, value in mx.load(path).items():
            name = rename(key)
            if name is not None:
                weights[name] = value
    return weights


def check_quantization(config: ASRConfig) -> tuple[int, int] | None:
    """``(group_size, bits)`` for MLX affine quantization; a clear error for formats MLX cannot run."""
    quant = config.quantization
    if not quant:
        return None
    method = quant.get("quant_method") or quant.get("mode") or "affine"
    if method != "affine" or "bits" not in quant:
        raise ValueError(
            f"unsupported quantization {quant!r}: this plugin runs MLX affine quantization "
            "(mlx-community conversions: 'quantization': {'group_size', 'bits'}) or unquantized weights"
        )
    return int(quant.get("group_size", 64)), int(quant["bits"])


def _channels_last(value: mx.array, expected_shape: tuple[int, ...]) -> mx.array:
    if tuple(value.shape) == expected_shape:
        return value
    moved = value.transpose(0, 2, 3, 1)  # torch [out, in, kh, kw] -> MLX [out, kh, kw, in]
    if tuple(moved.shape) == expected_shape:
        return moved
    raise ValueError(f"convolution weight of shape {value.shape}; expected {expected_shape}")


def load_into(network: nn.Module, config: ASRConfig, weights: dict[str, mx.array], dtype: mx.Dtype) -> None:
    quant = check_quantization(config)
    if quant is not None:
        group_size, bits = quant
        nn.quantize(
            network,
            group_size=group_size,
            bits=bits,
            class_predicate=lambda path, module: f"{path}.scales" in weights,
        )
    expected = dict(tree_flatten(network.parameters()))
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(
            "checkpoint does not match the Qwen3-ASR architecture of its config.json: "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}"
        )
    ready = []
    for name, value in weights.items():
        if ".conv2d" in name and name.endswith(".weight"):
            value = _channels_last(value, tuple(expected[name].shape))
        elif tuple(value.shape) != tuple(expected[name].shape):
            raise ValueError(f"{name}: checkpoint shape {value.shape}, model shape {expected[name].shape}")
        if mx.issubdtype(value.dtype, mx.floating):  # packed quantized weights are integers
            value = value.astype(dtype)
        ready.append((name, value))
    network.load_weights(ready, strict=True)
    mx.eval(network.parameters())
