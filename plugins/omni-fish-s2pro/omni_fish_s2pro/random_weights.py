"""Checkpoints whose weights are drawn at load (``random_weights.json`` in place of
model.safetensors and codec.pth): the ``full`` preset, the published sizes, for serving and
measuring speed without the real weights (some 9 GB that would be written and read for nothing).

The file gives the deviation, the seed and the codec's sizes (codec.pth, absent, would give them).
Each model is built on its stage's device and filled there: matrices normal(0, std) from a
generator of the seed, norm weights and Snake's alphas 1, biases 0, layer scales as built.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

RANDOM_WEIGHTS = "random_weights.json"


def random_settings(checkpoint_dir: str | Path) -> dict | None:
    path = Path(checkpoint_dir) / RANDOM_WEIGHTS
    return json.loads(path.read_text()) if path.exists() else None


@torch.no_grad()
def fill_random(model: torch.nn.Module, std: float = 0.02, seed: int = 0) -> torch.nn.Module:
    for name, param in model.named_parameters():
        if name.endswith(("norm.weight", ".alpha")):
            param.fill_(1.0)
        elif name.endswith(".bias"):
            param.zero_()
        elif not name.endswith(".gamma"):
            gen = torch.Generator(device=param.device).manual_seed(seed + sum(map(ord, name)))
            param.normal_(0.0, std, generator=gen)
    return model


def build_random(make, device, dtype: torch.dtype, settings: dict) -> torch.nn.Module:
    """``make()`` built on ``device`` in ``dtype`` and filled with random weights."""
    with torch.device(device):
        model = make()
    model = model.to(dtype=dtype)
    return fill_random(model, float(settings.get("std", 0.02)), int(settings.get("seed", 0))).eval()
