"""Qwen3-ASR as an omni topology: ``frontend`` (fn: chunking, log-mel, prompt) -> ``asr``
(mlx-asr: encoder, projector and decoder with continuous batching) -> ``text``."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

from omni_core.hooks import number_option, warn_random_weights
from omni_core.pipeline import Edge, StageSpec, Topology

from .engine import load_runtime
from .frontend import frontend_settings, make_frontend
from .presets import READY_MARK

ENGINE = "mlx-asr"


def build_topology(checkpoint_dir: str, options: dict[str, Any]) -> Topology:
    if os.path.exists(os.path.join(checkpoint_dir, READY_MARK)):  # the tiny preset: random weights
        warn_random_weights("qwen3-asr", checkpoint_dir, "tiny", "text")
    options = dict(options or {})
    frontend_settings(options)  # the frontend stage reads them: a bad one fails here, before it starts
    return Topology(
        stages=[
            StageSpec(
                "frontend", "fn", partial(make_frontend, checkpoint_dir, options), inputs=("in",), outputs=("features",)
            ),
            StageSpec(
                "asr",
                ENGINE,
                partial(load_runtime, checkpoint_dir, options),
                inputs=("features",),
                outputs=("text",),
                options={"max_batch": number_option(options, "max_batch", 32), "mlx_device": options.get("mlx_device")},
            ),
        ],
        edges=[Edge("frontend.features", "asr.features")],
        entry="frontend.in",
        outputs={"text": "asr.text"},
        name="qwen3-asr",
    )
