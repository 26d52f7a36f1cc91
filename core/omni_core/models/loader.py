"""Loading Hugging Face checkpoints (config.json + safetensors, sharded or not) into our modules.

Checkpoint tensors keep their official names. Three mappings bridge to our fused layout:
``q_proj``/``k_proj``/``v_proj`` -> rows of ``qkv_proj``, ``gate_proj``/``up_proj`` -> rows of
``gate_up_proj``, and per-expert tensors ``...experts.E.{gate,up,down}_proj.weight`` -> slice
``E`` of the stacked expert tensors (already-stacked ``experts.gate_up_proj`` loads as is).
Every parameter must be covered exactly; anything missing or unexpected is an error that names it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch
from torch import nn

from omni_core import progress
from omni_core.models.layers import PackedLinear

_PACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2), "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<expert>\d+)\.(?P<part>gate|up|down)_proj\.weight$")


class WeightLoadError(ValueError):
    """A checkpoint that does not fit the model: the message names the keys."""


def safetensors_files(checkpoint_dir: str | Path, prefix: str = "") -> list[Path]:
    """The checkpoint's safetensors files; with a sharded index and ``prefix``, only the shards
    that hold a tensor whose name starts with it."""
    root = Path(checkpoint_dir)
    index = root / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        names = {file for key, file in weight_map.items() if key.startswith(prefix)}
        if prefix and not names:
            raise WeightLoadError(f"{index} names no tensor under {prefix!r}")
        return [root / name for name in sorted(names)]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors files in {root}")
    return files


def iter_safetensors(checkpoint_dir: str | Path, prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in the checkpoint, or of those whose name starts with
    ``prefix`` (read from the shards that hold them only: a stage of a large checkpoint loads
    its own part)."""
    from safetensors import safe_open

    files = safetensors_files(checkpoint_dir, prefix)
    for path in progress.each(files, f"loading {Path(checkpoint_dir).name}{' ' + prefix.rstrip('.') if prefix else ''} weights (files)"):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                if name.startswith(prefix):
                    yield name, f.get_tensor(name)


def load_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]], strip_prefix: str = "", strict: bool = True) -> set[str]:
    """Copy ``weights`` into ``model``; returns the names of the parameters written.

    ``strip_prefix`` drops a leading part of checkpoint names (a backbone inside a bigger
    checkpoint). With ``strict``, unexpected names and incompletely loaded parameters raise.
    """
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    filled: dict[str, int] = {}
    unexpected: list[str] = []
    for name, tensor in weights:
        if strip_prefix:
            if not name.startswith(strip_prefix):
                continue
            name = name[len(strip_prefix) :]
        target = _copy_into(name, tensor, params, modules)
        if target is None:
            if name == "lm_head.weight" and getattr(model, "lm_head", 0) is None:
                continue  # tied embeddings: the head reuses embed_tokens
            unexpected.append(name)
            continue
        filled[target] = filled.get(target, 0) + tensor.numel()
    missing = [n for n, p in params.items() if filled.get(n, 0) != p.numel()]
    if strict and (unexpected or missing):
        raise WeightLoadError(f"checkpoint does not match {type(model).__name__}: missing or partial {missing[:8]}, unexpected {unexpected[:8]}")
    return set(filled)


def _copy_into(name: str, tensor: torch.Tensor, params: dict, modules: dict) -> str | None:
    m = _EXPERT.match(name)
    if m:
        stacked = f"{m['prefix']}.{'down_proj' if m['part'] == 'down' else 'gate_up_proj'}"
        if stacked not in params:
            return None
        dest = params[stacked][int(m["expert"])]
        if m["part"] != "down":
            rows = dest.shape[0] // 2
            dest = dest.narrow(0, 0 if m["part"] == "gate" else rows, rows)
        _checked_copy(dest, tensor, name)
        return stacked
    if name in params:
        _checked_copy(params[name].data, tensor, name)
        return name
    module_path, _, leaf = name.rpartition(".")
    parent, _, part = module_path.rpartition(".")
    if part in _PACKED:
        fused, index = _PACKED[part]
        module = modules.get(f"{parent}.{fused}" if parent else fused)
        if isinstance(module, PackedLinear):
            param = getattr(module, leaf)
            dest = param.data.narrow(0, module.shard_offset(index), module.shard_sizes[index])
            _checked_copy(dest, tensor, name)
            return f"{parent}.{fused}.{leaf}" if parent else f"{fused}.{leaf}"
    return None


def _checked_copy(dest: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dest.shape) != tuple(src.shape):
        raise WeightLoadError(f"{name}: checkpoint shape {tuple(src.shape)} != model shape {tuple(dest.shape)}")
    with torch.no_grad():
        dest.copy_(src.to(dest.dtype))


@torch.no_grad()
def random_init(model: nn.Module, seed: int = 0, std: float = 0.02) -> nn.Module:
    """Deterministic random weights (tiny presets, benchmarks): normal(0, std), norms at one."""
    gen = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.fill_(1.0)
        else:
            param.copy_(torch.randn(param.shape, generator=gen) * std)
    return model
