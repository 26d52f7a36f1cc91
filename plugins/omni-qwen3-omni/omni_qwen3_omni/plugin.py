"""Registers the ``qwen3-omni`` family (Qwen3-Omni: chat with text, audio, image and video in,
text and speech out) with omni."""

from __future__ import annotations

from omni_core.hooks import FamilySpec, Voice, hookimpl

from .options import OPTIONS

# Model code (torch, transformers) loads on first use, not when `omni plugins list` loads plugins.


def build(checkpoint_dir: str, options: dict):
    from .topology import build as build_topology

    return build_topology(checkpoint_dir, options)


def write_tiny(directory: str) -> str:
    from .presets import write_tiny as write

    return write(directory)


def write_full(directory: str) -> str:
    """Qwen3-Omni-30B-A3B's sizes with random weights drawn on the device at load (nothing written)."""
    from .presets import write_in_memory

    return write_in_memory(directory)


def voices(checkpoint_dir: str) -> list[Voice]:
    """The talker's speakers (``talker_config.speaker_id``); none for a thinker-only checkpoint."""
    from .config import load_checkpoint

    talker = getattr(load_checkpoint(checkpoint_dir).config, "talker_config", None)
    speakers = dict(getattr(talker, "speaker_id", None) or {})
    return [Voice(id=name.lower(), name=name.lower(), description="a built-in speaker of the checkpoint") for name in speakers]


@hookimpl
def omni_families():
    return [
        FamilySpec(
            name="qwen3-omni",
            tasks=("chat", "speech"),
            build=build,
            default_checkpoint="Qwen/Qwen3-Omni-30B-A3B-Instruct",
            presets={"tiny": write_tiny, "full": write_full},
            input_sample_rate=16000,
            sample_rate=24000,
            voices=voices,
            description="Qwen3-Omni: chat with text, audio, image and video in, text and speech out",
            options=OPTIONS,
        )
    ]
