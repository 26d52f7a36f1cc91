"""Whisper as a stage graph: frontend (log-mel, ``fn``) -> encoder (``batch``) -> decoder
(``whisper-decode``) -> text deltas."""

from __future__ import annotations

import functools

from omni_core.hooks import flag_option, number_option, warn_random_weights
from omni_core.pipeline import Edge, StageSpec, Topology

from omni_whisper import stages
from omni_whisper.cpu_threads import check_mode
from omni_whisper.dtypes import check_dtype


def build(checkpoint_dir: str, options: dict) -> Topology:
    """Options: ``options.OPTIONS`` (each with its default and meaning)."""
    from omni_whisper.presets import preset_name  # torch and transformers: not at plugin load

    preset = preset_name(checkpoint_dir)
    if preset:
        warn_random_weights("whisper", checkpoint_dir, preset, "transcript")
    dtype = check_dtype(str(options.get("dtype", "auto")))
    threads = str(options.get("threads", "split"))
    check_mode(threads)  # a bad value fails here, before any stage starts
    encoder_options = {
        "max_batch": number_option(options, "encoder_batch", 8),
        "batch_window_ms": number_option(options, "batch_window_ms", 5, float, allow_zero=True),
    }
    decoder_options = {
        "max_batch": number_option(options, "max_batch", 32),
        "temperature_fallback": flag_option(options, "temperature_fallback", False),
        "cuda_graphs": flag_option(options, "cuda_graphs", True),
    }
    make = functools.partial
    return Topology(
        name="whisper",
        stages=[
            StageSpec("frontend", "fn", make(stages.frontend_factory, checkpoint_dir=checkpoint_dir),
                      ("in",), ("mel",)),
            StageSpec("encoder", "batch", make(stages.encoder_factory, checkpoint_dir=checkpoint_dir, dtype=dtype, threads=threads),
                      ("mel",), ("encoded",), options=encoder_options),
            StageSpec("decoder", "whisper-decode", make(stages.decoder_factory, checkpoint_dir=checkpoint_dir, dtype=dtype, threads=threads),
                      ("encoded",), ("text",), options=decoder_options),
        ],
        edges=[Edge("frontend.mel", "encoder.mel"), Edge("encoder.encoded", "decoder.encoded")],
        entry="frontend.in",
        outputs={"text": "decoder.text"},
    )
