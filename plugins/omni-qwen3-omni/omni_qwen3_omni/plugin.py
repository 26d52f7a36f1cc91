"""Registers the ``qwen3-omni`` family (Qwen3-Omni: chat with audio, image and video in) with omni."""

from __future__ import annotations

from omni_core.hooks import FamilySpec, hookimpl

# Model code (torch, transformers) loads on first use, not when `omni plugins list` loads plugins.


def build(checkpoint_dir: str, options: dict):
    from .topology import build as build_topology

    return build_topology(checkpoint_dir, options)


def write_tiny(directory: str) -> str:
    from .presets import write_tiny as write

    return write(directory)


@hookimpl
def omni_families():
    return [
        FamilySpec(
            name="qwen3-omni",
            tasks=("chat",),
            build=build,
            default_checkpoint="Qwen/Qwen3-Omni-30B-A3B-Instruct",
            presets={"tiny": write_tiny},
            input_sample_rate=16000,
            description="Qwen3-Omni: chat with text, audio, image and video in, text out",
        )
    ]
