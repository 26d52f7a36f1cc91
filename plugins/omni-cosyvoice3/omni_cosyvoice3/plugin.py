"""Registers the ``cosyvoice3`` family (Fun-CosyVoice3 text to speech) with omni."""

from __future__ import annotations

from omni_core.hooks import FamilySpec, Voice, hookimpl

from .options import OPTIONS
from .reference import REFERENCE_LIMITS

# Model code (torch, transformers) loads on first use, not when `omni plugins list` loads plugins.


def build(checkpoint_dir: str, options: dict):
    from .topology import build as build_topology

    return build_topology(checkpoint_dir, options)


def write_tiny(directory: str) -> str:
    from .presets import write_random_checkpoint

    return write_random_checkpoint(directory, "tiny")


def write_full(directory: str) -> str:
    """The real sizes with random weights: for speed measurements without the real checkpoint."""
    from .presets import write_random_checkpoint

    return write_random_checkpoint(directory, "full")


def voices(checkpoint_dir: str) -> list[Voice]:
    """The speakers of spk2info.pt (the tiny preset has one, ``default``)."""
    from .checkpoint import load_speakers

    return [
        Voice(id=name, name=name, description="built-in speaker (spk2info.pt)")
        for name in sorted(load_speakers(checkpoint_dir))
    ]


def split_speech(checkpoint_dir: str, payload: dict) -> list[dict]:
    """Long text as segments of whole sentences, spoken in turn (``segments``)."""
    from .segments import split_speech as split

    return split(checkpoint_dir, payload)


@hookimpl
def omni_families():
    return [
        FamilySpec(
            name="cosyvoice3",
            tasks=("speech",),
            build=build,
            default_checkpoint="FunAudioLLM/Fun-CosyVoice3-0.5B-2512",
            presets={"tiny": write_tiny, "full": write_full},
            sample_rate=24000,
            voices=voices,
            split_speech=split_speech,
            description="Fun-CosyVoice3 TTS: streaming synthesis and zero-shot voice cloning",
            options=OPTIONS,
            reference_limits=REFERENCE_LIMITS,
        )
    ]
