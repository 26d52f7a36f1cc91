"""omni hook implementations: the ``qwen3-asr`` family and the ``mlx-asr`` engine."""

from __future__ import annotations

from omni_core.hooks import EngineSpec, FamilySpec, hookimpl

from .options import OPTIONS
from .presets import tiny_preset


def _build(checkpoint_dir, options):
    from .topology import build_topology

    return build_topology(checkpoint_dir, options)


def _build_engine(stage, context):
    from .engine import MLXASRExecutor

    return MLXASRExecutor(stage, context)


@hookimpl
def omni_families():
    return [
        FamilySpec(
            name="qwen3-asr",
            tasks=("transcription",),
            build=_build,
            default_checkpoint="Qwen/Qwen3-ASR-0.6B",
            presets={"tiny": tiny_preset},
            input_sample_rate=16000,
            description="Qwen3-ASR 0.6B/1.7B speech recognition on MLX (Metal on Apple Silicon, CPU elsewhere)",
            options=OPTIONS,
        )
    ]


@hookimpl
def omni_platforms():
    from .platform import MLXPlatform

    return [MLXPlatform()]


@hookimpl
def omni_engines():
    return [
        EngineSpec(
            "mlx-asr",
            _build_engine,
            "Qwen3-ASR on MLX: audio encoder + Qwen3 decoder, continuous batching of concurrent requests",
        )
    ]
