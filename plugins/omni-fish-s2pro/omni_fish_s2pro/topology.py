"""S2-Pro as a stage graph: frontend (fn) -> dual_ar (ar: slow AR + fast AR) =codes=> codec (batch) -> audio.

Weights load inside the stage factories, in the process that hosts each stage: the frontend
holds the codec for its encoder (references), the codec stage its own copy for decoding.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from omni_core.hooks import engine_graph_options, number_option, warn_random_weights
from omni_core.pipeline import Edge, StageSpec, Topology
from omni_core.platforms import platform_for
from omni_core.scheduler.engine import EngineConfig
from omni_core.scheduler.sampling_params import SamplingParams

from .checkpoint import check_layout, load_fast_ar, load_slow_ar
from .codec_checkpoint import load_codec
from .codec_stage import Chunking, CodecWorker
from .config import load_config, load_tokenizer, token_ids
from .dual_ar_stage import DEFAULT_SAMPLING, DualARWorker
from .frontend import Frontend, FrontendWorker
from .presets import describe

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str, device) -> torch.dtype:
    if name == "auto":
        return getattr(torch, platform_for(device).default_dtype)  # bfloat16 on CUDA and XPU, float32 on CPU
    if name not in DTYPES:
        raise ValueError(f"fish-s2pro: dtype must be auto or one of {sorted(DTYPES)}, not {name!r}")
    return DTYPES[name]


def frontend_factory(context, checkpoint_dir: str, codec_dtype: str):
    cfg = load_config(checkpoint_dir)
    codec = load_codec(
        checkpoint_dir, context.device, resolve_dtype(codec_dtype, context.device), cfg.sample_rate
    )
    return FrontendWorker(
        Frontend(load_tokenizer(checkpoint_dir), token_ids(checkpoint_dir, cfg.codebook_size), codec)
    )


def dual_ar_factory(
    context,
    checkpoint_dir: str,
    dtype: str,
    engine: dict,
    max_new_tokens: int,
    sampling: dict,
    segment_context: int = 2,
):
    cfg = load_config(checkpoint_dir)
    torch_dtype = resolve_dtype(dtype, context.device)
    slow = load_slow_ar(checkpoint_dir, context.device, torch_dtype)
    fast = load_fast_ar(checkpoint_dir, context.device, torch_dtype)
    ids = token_ids(checkpoint_dir, cfg.codebook_size)
    return DualARWorker(
        slow, fast, ids, EngineConfig(dtype=torch_dtype, **engine), max_new_tokens, sampling, segment_context
    )


def codec_factory(context, checkpoint_dir: str, codec_dtype: str, chunking: dict):
    cfg = load_config(checkpoint_dir)
    codec = load_codec(
        checkpoint_dir, context.device, resolve_dtype(codec_dtype, context.device), cfg.sample_rate
    )
    return CodecWorker(codec, Chunking(**chunking))


def build(checkpoint_dir: str, options: dict) -> Topology:
    """Options: ``options.OPTIONS`` (each with its default and meaning)."""
    check_layout(checkpoint_dir)
    cfg = load_config(checkpoint_dir)
    preset = describe(checkpoint_dir)
    if preset:
        warn_random_weights("fish-s2pro", checkpoint_dir, preset, "audio")
    dtype, codec_dtype = str(options.get("dtype", "auto")), str(options.get("codec_dtype", "float32"))
    for name in (dtype, codec_dtype):
        resolve_dtype(name, "cpu")
    max_batch = number_option(options, "max_batch", 32)
    kv = options.get("kv_cache_bytes")
    engine = dict(
        max_num_seqs=max_batch,
        max_model_len=min(number_option(options, "max_model_len", cfg.max_seq_len), cfg.max_seq_len),
        kv_cache_bytes=None if kv is None else number_option(options, "kv_cache_bytes", 0),
        max_num_batched_tokens=number_option(options, "max_num_batched_tokens", 8192),
        enable_prefix_caching=False,  # prompts are embeddings (frames), which the prefix cache cannot key
        **engine_graph_options(options),
    )
    sampling = {
        key: number_option(options, key, None, kind=kind, allow_zero=True)
        for key, kind in (("temperature", float), ("top_p", float), ("top_k", int))
        if key in options
    }
    try:  # refused at start-up, not on every request
        SamplingParams(**{**DEFAULT_SAMPLING, **sampling})
    except ValueError as e:
        raise ValueError(f"fish-s2pro: option {e}") from None
    chunking = dict(
        first_chunk=number_option(options, "audio_first_chunk", 4),
        chunk=number_option(options, "audio_chunk", 32),
        left_context=number_option(options, "audio_left_context", 8, allow_zero=True),
    )
    batch = {
        "max_batch": max_batch,
        "batch_window_ms": number_option(options, "batch_window_ms", 1.0, kind=float, allow_zero=True),
    }
    make = functools.partial
    path = str(Path(checkpoint_dir))
    return Topology(
        name="fish-s2pro",
        stages=[
            StageSpec(
                "frontend",
                "fn",
                make(frontend_factory, checkpoint_dir=path, codec_dtype=codec_dtype),
                ("in",),
                ("prompt",),
            ),
            StageSpec(
                "dual_ar",
                "ar",
                make(
                    dual_ar_factory,
                    checkpoint_dir=path,
                    dtype=dtype,
                    engine=engine,
                    max_new_tokens=number_option(options, "max_new_tokens", 1024),
                    sampling=sampling,
                    segment_context=number_option(options, "segment_context", 2, allow_zero=True),
                ),
                ("in",),
                ("codes",),
                options={"family": "fish-s2pro"},
            ),
            StageSpec(
                "codec",
                "batch",
                make(codec_factory, checkpoint_dir=path, codec_dtype=codec_dtype, chunking=chunking),
                ("in",),
                ("audio",),
                options=dict(batch),
            ),
        ],
        edges=[Edge("frontend.prompt", "dual_ar.in"), Edge("dual_ar.codes", "codec.in", kind="stream")],
        entry="frontend.in",
        outputs={"audio": "codec.audio"},
    )
