"""Registers the ``fish-s2pro`` family (Fish Audio S2-Pro: dual-AR text to speech with zero-shot
voice cloning) with omni."""

from __future__ import annotations

from omni_core.hooks import FamilySpec, Voice, hookimpl

from .options import OPTIONS
from .reference import REFERENCE_LIMITS

# Model code (torch, tokenizers) loads on first use, not when `omni plugins list` loads plugins.


def build(checkpoint_dir: str, options: dict):
    from .topology import build as build_topology

    return build_topology(checkpoint_dir, options)


def write_tiny(directory: str) -> str:
    from .presets import write_tiny as write

    return write(directory)


def write_full(directory: str) -> str:
    """The published sizes with random weights drawn on the device at load (nothing but configs written)."""
    from .presets import write_full as write

    return write(directory)


def voices(checkpoint_dir: str) -> list[Voice]:
    """One: the model's own voice (S2-Pro has no named speakers; any other voice is cloned)."""
    return [Voice(id="default", name="default", description="the model's own voice (no reference)")]


def split_speech(checkpoint_dir: str, payload: dict) -> list[dict]:
    """Long text as segments of whole sentences (or speaker turns), spoken in turn (``segments``)."""
    from .segments import split_speech as split

    return split(checkpoint_dir, payload)


@hookimpl
def omni_families():
    return [
        FamilySpec(
            name="fish-s2pro",
            tasks=("speech",),
            build=build,
            default_checkpoint="fishaudio/s2-pro",
            presets={"tiny": write_tiny, "full": write_full},
            sample_rate=44100,
            voices=voices,
            split_speech=split_speech,
            segments_in_turn=True,  # a segment's prompt carries the codes of those before (segment_context)
            description="Fish Audio S2-Pro TTS: dual-AR (slow + fast AR) with zero-shot voice cloning, 44.1 kHz",
            options=OPTIONS,
            reference_limits=REFERENCE_LIMITS,
        )
    ]
