"""Qwen3-Omni as a stage graph:

    preprocess (fn) -> {audio_encoder (batch), vision_encoder (batch)} -> thinker (ar) -> text
                                       thinker =hidden=> talker (ar, code predictor in its steps)
                                       talker =codes=> code2wav (batch, chunked) -> audio

The encoders run only for requests that hold audio, or images and videos, and the talker only
for requests that ask for audio (``Edge.when``); the thinker is a fan-in that waits for the
encoders a request reaches. With ``audio_output=false`` (or a thinker-only checkpoint) the
talker and code2wav stages are not built. Weights load inside the stage factories, each reading
its own prefix of the checkpoint.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from omni_core.hooks import choice_option, engine_graph_options, flag_option, number_option
from omni_core.pipeline import Edge, StageSpec, Topology
from omni_core.platforms import platform_for
from omni_core.scheduler.engine import ENGINE_STREAMS, EngineConfig

from .checkpoint import (
    check_layout,
    load_audio_encoder,
    load_code2wav,
    load_code_predictor,
    load_talker,
    load_thinker,
    load_thinker_embedding,
    load_vision_encoder,
    resolve_dtype,
)
from .code2wav_stage import Chunking, Code2WavWorker
from .config import load_checkpoint
from .speech import SpeechIds
from .stages import AudioEncoderWorker, Preprocessor, ThinkerWorker, VisionEncoderWorker
from .talker_stage import TalkerSampling, TalkerWorker


def preprocess_factory(context, checkpoint_dir: str, limits: dict, speaks: bool = False):
    return Preprocessor(load_checkpoint(checkpoint_dir), limits, speaks)


def audio_factory(context, checkpoint_dir: str, dtype: str):
    ckpt = load_checkpoint(checkpoint_dir)
    return AudioEncoderWorker(load_audio_encoder(ckpt, context.device, resolve_dtype(dtype, context.device)), ckpt)


def vision_factory(context, checkpoint_dir: str, dtype: str):
    ckpt = load_checkpoint(checkpoint_dir)
    return VisionEncoderWorker(load_vision_encoder(ckpt, context.device, resolve_dtype(dtype, context.device)), ckpt)


def thinker_factory(context, checkpoint_dir: str, dtype: str, engine: dict, speaks: bool = False):
    ckpt = load_checkpoint(checkpoint_dir)
    model = load_thinker(ckpt, context.device, resolve_dtype(dtype, context.device))
    config = EngineConfig(eos_token_ids=ckpt.tokens.eos, **engine)
    return ThinkerWorker(model, ckpt, config, default_sampling(checkpoint_dir), speaks)


def talker_factory(context, checkpoint_dir: str, dtype: str, engine: dict, sampling: dict):
    ckpt = load_checkpoint(checkpoint_dir)
    device, torch_dtype = context.device, resolve_dtype(dtype, context.device)
    model, projections = load_talker(ckpt, device, torch_dtype)
    predictor = load_code_predictor(ckpt, device, torch_dtype)
    table = load_thinker_embedding(ckpt, device, torch_dtype)
    if engine["kv_cache_bytes"] is None and platform_for(device).accelerator:
        # not the engine's default half of the free memory: the thinker's engine shares the device
        engine = dict(engine, kv_cache_bytes=TALKER_KV_BYTES)
    return TalkerWorker(model, projections, predictor, table, SpeechIds.of(ckpt), EngineConfig(**engine), TalkerSampling(**sampling))


TALKER_KV_BYTES = 2 << 30  # ~100k positions of the real talker (20 KB each in bf16): 64 streams of 2 minutes


def code2wav_factory(context, checkpoint_dir: str, dtype: str, chunking: dict):
    ckpt = load_checkpoint(checkpoint_dir)
    model = load_code2wav(ckpt, context.device, resolve_dtype(dtype, context.device))
    return Code2WavWorker(model, Chunking(**chunking))


def default_sampling(checkpoint_dir: str) -> dict:
    """The checkpoint's generation_config.json sampling settings (greedy where it does not sample)."""
    path = Path(checkpoint_dir) / "generation_config.json"
    raw = json.loads(path.read_text()) if path.exists() else {}
    if raw.get("do_sample") is False:
        return {"temperature": 0.0}
    return {k: raw[k] for k in ("temperature", "top_p", "top_k", "repetition_penalty") if raw.get(k) is not None}


def _speaks(inputs: dict) -> bool:
    return "audio" in (inputs.get("modalities") or ()) or inputs.get("task") == "speech"


def _has(kinds: tuple[str, ...]):
    def when(inputs: dict) -> bool:
        return any(part.get("type") in kinds for m in inputs.get("messages") or () for part in m.get("content") or ())

    return when


def build(checkpoint_dir: str, options: dict) -> Topology:
    """Options: ``options.OPTIONS`` (each with its default and meaning)."""
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
        enable_prefix_caching=flag_option(options, "prefix_caching", True),
        **engine_graph_options(options),
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
    speaks = _audio_output(options, ckpt)
    path = str(Path(checkpoint_dir))
    make = functools.partial
    topology = Topology(
        name="qwen3-omni",
        stages=[
            StageSpec("preprocess", "fn", make(preprocess_factory, checkpoint_dir=path, limits=limits, speaks=speaks), ("in",), ("prompt", "audio", "vision")),
            StageSpec("audio_encoder", "batch", make(audio_factory, checkpoint_dir=path, dtype=dtype), ("in",), ("out",), options=dict(batch)),
            StageSpec("vision_encoder", "batch", make(vision_factory, checkpoint_dir=path, dtype=dtype), ("in",), ("out",), options=dict(batch)),
            StageSpec(
                "thinker",
                "ar",
                make(thinker_factory, checkpoint_dir=path, dtype=dtype, engine=engine, speaks=speaks),
                ("prompt", "audio", "vision"),
                ("text", "hidden") if speaks else ("text",),
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
    if speaks:
        _add_speech(topology, path, dtype, options, max_batch, batch)
    return topology


def _audio_output(options: dict, ckpt) -> bool:
    """``audio_output`` (default: whether the checkpoint has the speech half)."""
    has_talker = getattr(ckpt.config, "talker_config", None) is not None
    value = options.get("audio_output", has_talker)
    speaks = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
    if speaks and not has_talker:
        raise ValueError(f"qwen3-omni: {ckpt.path} has no talker (a thinker-only checkpoint): use --option audio_output=false")
    return speaks


def _add_speech(topology: Topology, path: str, dtype: str, options: dict, max_batch: int, batch: dict) -> None:
    """The talker (fed by the thinker's ``hidden`` stream) and code2wav, for requests that ask for audio."""
    kv = options.get("talker_kv_cache_bytes")
    engine = dict(
        max_num_seqs=max_batch,
        kv_cache_bytes=None if kv is None else number_option(options, "talker_kv_cache_bytes", 0),
        enable_prefix_caching=False,  # prompts are embeddings
        **engine_graph_options(options),
        # own / high: its steps (which set when audio is heard) stop queueing behind the thinker's
        stream=choice_option(options, "talker_stream", ENGINE_STREAMS),
    )
    sampling = dict(
        temperature=number_option(options, "talker_temperature", 0.9, kind=float, allow_zero=True),
        top_k=number_option(options, "talker_top_k", 50, allow_zero=True),
        top_p=number_option(options, "talker_top_p", 1.0, kind=float),
        repetition_penalty=number_option(options, "talker_repetition_penalty", 1.05, kind=float),
        max_tokens=number_option(options, "talker_max_tokens", 4096),
    )
    chunking = dict(
        first_chunk=number_option(options, "audio_first_chunk", 4),
        chunk=number_option(options, "audio_chunk", 25),
        left_context=number_option(options, "audio_left_context", 25, allow_zero=True),
    )
    make = functools.partial
    topology.stages += [
        StageSpec("talker", "ar", make(talker_factory, checkpoint_dir=path, dtype=dtype, engine=engine, sampling=sampling), ("in",), ("codes",),
                  options={"family": "qwen3-omni"}),
        StageSpec("code2wav", "batch", make(code2wav_factory, checkpoint_dir=path, dtype=dtype, chunking=chunking), ("in",), ("audio",),
                  options=dict(batch)),
    ]
    topology.edges += [
        Edge("thinker.hidden", "talker.in", kind="stream", when=_speaks),
        Edge("talker.codes", "code2wav.in", kind="stream"),
    ]
    topology.outputs["audio"] = "code2wav.audio"
