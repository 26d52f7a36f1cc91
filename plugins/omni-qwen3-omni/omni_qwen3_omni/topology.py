"""Qwen3-Omni's thinker as a stage graph:

    preprocess (fn) -> {audio_encoder (batch), vision_encoder (batch)} -> thinker (ar) -> text

The encoders run only for requests that hold audio, or images and videos (``Edge.when``); the
thinker is a fan-in that waits for the encoders a request reaches. Weights load inside the stage
factories, each reading its own prefix of the checkpoint.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from omni_core.hooks import number_option
from omni_core.pipeline import Edge, StageSpec, Topology
from omni_core.scheduler.engine import EngineConfig

from .checkpoint import check_layout, load_audio_encoder, load_thinker, load_vision_encoder, resolve_dtype
from .config import load_checkpoint
from .stages import AudioEncoderWorker, Preprocessor, ThinkerWorker, VisionEncoderWorker


def preprocess_factory(context, checkpoint_dir: str, limits: dict):
    return Preprocessor(load_checkpoint(checkpoint_dir), limits)


def audio_factory(context, checkpoint_dir: str, dtype: str):
    ckpt = load_checkpoint(checkpoint_dir)
    return AudioEncoderWorker(load_audio_encoder(ckpt, context.device, resolve_dtype(dtype, context.device)), ckpt)


def vision_factory(context, checkpoint_dir: str, dtype: str):
    ckpt = load_checkpoint(checkpoint_dir)
    return VisionEncoderWorker(load_vision_encoder(ckpt, context.device, resolve_dtype(dtype, context.device)), ckpt)


def thinker_factory(context, checkpoint_dir: str, dtype: str, engine: dict):
    ckpt = load_checkpoint(checkpoint_dir)
    model = load_thinker(ckpt, context.device, resolve_dtype(dtype, context.device))
    config = EngineConfig(eos_token_ids=ckpt.tokens.eos, **engine)
    return ThinkerWorker(model, ckpt, config, default_sampling(checkpoint_dir))


def default_sampling(checkpoint_dir: str) -> dict:
    """The checkpoint's generation_config.json sampling settings (greedy where it does not sample)."""
    path = Path(checkpoint_dir) / "generation_config.json"
    raw = json.loads(path.read_text()) if path.exists() else {}
    if raw.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: raw[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty") if raw.get(k) is not None}


def _has(kinds: tuple[str, ...]):
    def when(inputs: dict) -> bool:
        return any(part.get("type") in kinds for m in inputs.get("messages") or () for part in m.get("content") or ())

    return when


def build(checkpoint_dir: str, options: dict) -> Topology:
    """Options: ``dtype`` (auto: bfloat16 on CUDA, float32 on CPU; or float32 | bfloat16 |
    float16), ``max_batch`` (thinker sequences and encoder batch, 32), ``batch_window_ms`` (2),
    ``max_model_len`` (prompt + reply tokens, 32768 or the model's limit), ``kv_cache_bytes``,
    ``max_num_batched_tokens`` (a prefill step's token budget, 8192), ``cuda_graphs`` (True),
    ``prefix_caching`` (True), ``max_audios`` / ``max_images`` / ``max_videos`` (parts a request may
    hold: 8 / 8 / 2), ``video_fps`` (2), ``video_max_frames`` (64), ``video_min_pixels`` /
    ``video_max_pixels`` (per frame: 131072 / 786432)."""
    check_layout(checkpoint_dir)
    ckpt = load_checkpoint(checkpoint_dir)
    dtype = str(options.get("dtype", "auto"))
    resolve_dtype(dtype, "cpu")
    max_batch = number_option(options, "max_batch", 32)
    model_limit = int(ckpt.text_config.max_position_embeddings)
    max_model_len = min(number_option(options, "max_model_len", min(32768, model_limit)), model_limit)
    kv = options.get("kv_cache_bytes")
    engine = dict(
        max_num_seqs=max_batch,
        max_model_len=max_model_len,
        kv_cache_bytes=None if kv is None else number_option(options, "kv_cache_bytes", 0),
        max_num_batched_tokens=number_option(options, "max_num_batched_tokens", 8192),
        cuda_graphs=bool(options.get("cuda_graphs", True)),
        enable_prefix_caching=bool(options.get("prefix_caching", True)),
    )
    limits = dict(
        max_audios=number_option(options, "max_audios", 8, allow_zero=True),
        max_images=number_option(options, "max_images", 8, allow_zero=True),
        max_videos=number_option(options, "max_videos", 2, allow_zero=True),
        video_fps=number_option(options, "video_fps", 2.0, kind=float),
        video_max_frames=number_option(options, "video_max_frames", 64),
        video_min_pixels=number_option(options, "video_min_pixels", ckpt.vision.video_min_pixels),
        video_max_pixels=number_option(options, "video_max_pixels", ckpt.vision.video_max_pixels),
        max_model_len=max_model_len,
    )
    batch = {"max_batch": max_batch, "batch_window_ms": number_option(options, "batch_window_ms", 2.0, kind=float, allow_zero=True)}
    path = str(Path(checkpoint_dir))
    make = functools.partial
    return Topology(
        name="qwen3-omni",
        stages=[
            StageSpec("preprocess", "fn", make(preprocess_factory, checkpoint_dir=path, limits=limits), ("in",), ("prompt", "audio", "vision")),
            StageSpec("audio_encoder", "batch", make(audio_factory, checkpoint_dir=path, dtype=dtype), ("in",), ("out",), options=dict(batch)),
            StageSpec("vision_encoder", "batch", make(vision_factory, checkpoint_dir=path, dtype=dtype), ("in",), ("out",), options=dict(batch)),
            StageSpec(
                "thinker",
                "ar",
                make(thinker_factory, checkpoint_dir=path, dtype=dtype, engine=engine),
                ("prompt", "audio", "vision"),
                ("text",),
                options={"family": "qwen3-omni"},
            ),
        ],
        edges=[
            Edge("preprocess.prompt", "thinker.prompt"),
            Edge("preprocess.audio", "audio_encoder.in", when=_has(("audio",))),
            Edge("preprocess.vision", "vision_encoder.in", when=_has(("image", "video"))),
            Edge("audio_encoder.out", "thinker.audio"),
            Edge("vision_encoder.out", "thinker.vision"),
        ],
        entry="preprocess.in",
        outputs={"text": "thinker.text"},
    )
