"""Whisper as a stage graph: frontend (log-mel, ``fn``) -> encoder (``batch``) -> decoder
(``whisper-decode``) -> text deltas."""

from __future__ import annotations

import functools

from omni_core.pipeline import Edge, StageSpec, Topology

from omni_whisper import stages
from omni_whisper.cpu_features import cpu_has_native_bf16, cpu_has_vnni
from omni_whisper.cpu_threads import check_mode
from omni_whisper.int8 import int8_supported


def resolve_dtype(name: str) -> str:
    """``auto``: int8 where the CPU has VNNI int8 instructions (measured faster than bfloat16 at
    concurrency 1 and 16, same word error rate within a point), else bfloat16 where it has native
    bf16, else float32."""
    if name == "auto":
        if int8_supported()[0] and cpu_has_vnni():
            return "int8"
        return "bfloat16" if cpu_has_native_bf16() else "float32"
    if name not in ("float32", "bfloat16", "int8"):
        raise ValueError(f"whisper: dtype must be auto, float32, bfloat16 or int8, not {name!r}")
    if name == "int8":
        supported, reason = int8_supported()
        if not supported:
            raise ValueError(f"whisper: dtype int8 is not available here: {reason}")
    return name


def build(checkpoint_dir: str, options: dict) -> Topology:
    """Options: ``dtype`` (auto | int8 | bfloat16 | float32; see ``resolve_dtype``), ``threads``
    (split | shared, default split; see ``cpu_threads``), ``max_batch`` (decoder rows, 32),
    ``encoder_batch`` (requests encoded together, 8), ``batch_window_ms`` (encoder, 5),
    ``temperature_fallback`` (default False)."""
    dtype = resolve_dtype(str(options.get("dtype", "auto")))
    threads = str(options.get("threads", "split"))
    check_mode(threads)  # a bad value fails here, before any stage starts
    encoder_options = {
        "max_batch": int(options.get("encoder_batch", 8)),
        "batch_window_ms": float(options.get("batch_window_ms", 5)),
    }
    decoder_options = {
        "max_batch": int(options.get("max_batch", 32)),
        "temperature_fallback": bool(options.get("temperature_fallback", False)),
    }
    make = functools.partial
    return Topology(
        name="whisper",
        stages=[
            StageSpec("frontend", "fn", make(stages.frontend_factory, checkpoint_dir=checkpoint_dir, dtype=dtype),
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
