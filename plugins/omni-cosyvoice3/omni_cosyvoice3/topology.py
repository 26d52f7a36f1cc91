"""CosyVoice3 as a stage graph: frontend (fn) -> llm (ar) =tokens=> flow (batch) =mel=> hift (batch) -> audio.

The frontend also sends the flow the speaker conditioning (``cond``). Weights load inside the
stage factories, in the process that hosts each stage.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch
from omni_core.hooks import (
    choice_option,
    engine_graph_options,
    flag_option,
    number_option,
    warn_random_weights,
)
from omni_core.pipeline import Edge, StageSpec, Topology
from omni_core.platforms import platform_for
from omni_core.scheduler.engine import ENGINE_STREAMS, EngineConfig

from .checkpoint import check_layout, load_flow, load_hift, load_llm, load_speakers
from .config import load_config
from .deadline import SCHEDULES, DeadlineFlowWorker, DeadlineHiftWorker
from .flow_cache import FlowCache
from .frontend import Frontend
from .graph_buckets import parse_buckets, parse_warm
from .llm_stage import SpeechTokenWorker
from .presets import describe
from .stage_workers import FlowWorker, FrontendWorker, HiftWorker

# fine steps past 256 frames: at large batches the DiT is compute-bound, so padding costs
DEFAULT_GRAPH_FRAMES = "64,128,192,256,384,512,640,768,1024,1280,1536,2048"
# batch x frames past which a call is compute-bound on a large GPU: eager, no padding, no graph pool
DEFAULT_GRAPH_MAX_WORK = 8192
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ValueError(f"cosyvoice3: dtype must be one of {sorted(DTYPES)}, not {name!r}")
    return DTYPES[name]


def frontend_factory(context, checkpoint_dir: str, max_hop: int = 100):
    cfg = load_config(checkpoint_dir)
    return FrontendWorker(
        Frontend(checkpoint_dir, load_speakers(checkpoint_dir), cfg.sample_rate), cfg.chunk_size, max_hop
    )


def llm_factory(
    context,
    checkpoint_dir: str,
    dtype: str,
    max_num_seqs: int,
    kv_cache_bytes: int | None,
    graph_options: dict,
    length_ratios: tuple[float, float] = (2.0, 20.0),
    overlap_decode: bool = False,
    block_all_stops: bool = False,
    stream: str = "shared",
):
    model = load_llm(checkpoint_dir)
    model.cfg.min_token_text_ratio, model.cfg.max_token_text_ratio = length_ratios
    config = EngineConfig(
        max_num_seqs=max_num_seqs,
        kv_cache_bytes=kv_cache_bytes,
        dtype=_dtype(dtype),
        enable_prefix_caching=True,
        **graph_options,
        overlap_decode=overlap_decode,
        stream=stream,
    )
    model = model.to(device=context.device, dtype=_dtype(dtype))
    return SpeechTokenWorker(model, config, block_all_stops)


def _graph_plan(options: dict, prefix: str, max_batch: int) -> dict | None:
    """``<prefix>_graphs`` (warm buckets: batch1 | all | none | BxT,...) and ``<prefix>_graph_frames``;
    batch buckets are powers of two up to ``max_batch``. None when graphs are off."""
    warm = str(options.get(f"{prefix}_graphs", "batch1"))
    if not flag_option(options, "cuda_graphs", True) or warm.strip().lower() == "off":
        return None
    frames = parse_buckets(str(options.get(f"{prefix}_graph_frames", DEFAULT_GRAPH_FRAMES)))
    batches = parse_buckets([2**i for i in range(max_batch.bit_length()) if 2**i < max_batch] + [max_batch])
    max_work = int(options.get(f"{prefix}_graph_max_work", DEFAULT_GRAPH_MAX_WORK))
    plan = {"batches": batches, "frames": frames, "warm": parse_warm(warm, batches, frames), "max_work": max_work}
    for b, t in plan["warm"]:
        if b > batches[-1] or t > frames[-1]:
            raise ValueError(f"cosyvoice3: {prefix}_graphs bucket {b}x{t} exceeds the largest bucket")
    return plan


def _captures_graphs(context) -> bool:
    return platform_for(context.device).supports_graphs


def flow_factory(
    context,
    checkpoint_dir: str,
    dtype: str,
    max_hop: int,
    graphs: dict | None = None,
    cache_bytes: int = 0,
    schedule: str = SCHEDULES[0],
    masked_last: bool = False,
    cache_graphs: bool = False,
):
    cfg = load_config(checkpoint_dir)
    model = load_flow(checkpoint_dir, cfg).to(device=context.device, dtype=_dtype(dtype))
    if graphs and _captures_graphs(context):
        model.use_graphs(graphs["batches"], graphs["frames"], graphs["warm"], graphs["max_work"])
    cache = None
    if cache_bytes > 0:
        cache = FlowCache(cfg.flow, cache_bytes, context.device, model.dtype, use_graphs=cache_graphs)
    if schedule == "deadline":
        mel_seconds = cfg.hift.samples_per_frame / cfg.sample_rate
        return DeadlineFlowWorker(
            model, cfg.chunk_size, max_hop, cache, masked_last=masked_last, mel_seconds=mel_seconds
        )
    return FlowWorker(model, cfg.chunk_size, max_hop, cache, masked_last=masked_last)


def hift_factory(context, checkpoint_dir: str, dtype: str, graphs: dict | None = None, schedule: str = SCHEDULES[0]):
    model = load_hift(checkpoint_dir).to(device=context.device, dtype=_dtype(dtype))
    if graphs and _captures_graphs(context):
        model.use_graphs(graphs["batches"], graphs["frames"], graphs["warm"], graphs["max_work"])
    if schedule == "deadline":
        return DeadlineHiftWorker(model, sample_rate=load_config(checkpoint_dir).sample_rate)
    return HiftWorker(model)


def build(checkpoint_dir: str, options: dict) -> Topology:
    """Options: ``options.OPTIONS`` (each with its default and meaning)."""
    check_layout(checkpoint_dir)
    preset = describe(checkpoint_dir)["preset"]
    if preset:
        warn_random_weights("cosyvoice3", checkpoint_dir, preset, "audio")
    dtype = str(options.get("dtype", "float32"))
    llm_dtype = str(options.get("llm_dtype", dtype))
    hift_dtype = str(options.get("hift_dtype", "float32"))
    for name in (dtype, llm_dtype, hift_dtype):
        _dtype(name)
    max_batch = int(options.get("max_batch", 32))
    schedule = choice_option(options, "schedule", SCHEDULES)
    flow_graphs, hift_graphs = (
        _graph_plan(options, "flow", max_batch),
        _graph_plan(options, "hift", max_batch),
    )
    # a short window: a flow or HiFT call queues what arrives meanwhile for the next batch anyway
    batch_options = {"max_batch": max_batch, "batch_window_ms": float(options.get("batch_window_ms", 1))}
    kv = options.get("kv_cache_bytes")
    make = functools.partial
    path = str(Path(checkpoint_dir))
    return Topology(
        name="cosyvoice3",
        stages=[
            StageSpec(
                "frontend",
                "fn",
                make(frontend_factory, checkpoint_dir=path, max_hop=int(options.get("max_hop", 100))),
                ("in",),
                ("llm", "cond"),
            ),
            StageSpec(
                "llm",
                "ar",
                make(
                    llm_factory,
                    checkpoint_dir=path,
                    dtype=llm_dtype,
                    max_num_seqs=max_batch,
                    kv_cache_bytes=None if kv is None else int(kv),
                    graph_options=engine_graph_options(options),
                    length_ratios=(
                        float(options.get("min_token_text_ratio", 2.0)),
                        float(options.get("max_token_text_ratio", 20.0)),
                    ),
                    overlap_decode=flag_option(options, "llm_overlap_decode", False),
                    block_all_stops=choice_option(options, "min_length_blocks", ("reference", "all")) == "all",
                    # high: the device starts its decode kernels ahead of the flow's (on a stream of its own) waiting ones
                    stream=choice_option(options, "llm_stream", ENGINE_STREAMS),
                ),
                ("in",),
                ("tokens",),
                options={"family": "cosyvoice3"},
            ),
            StageSpec(
                "flow",
                "batch",
                make(
                    flow_factory,
                    checkpoint_dir=path,
                    dtype=dtype,
                    max_hop=int(options.get("max_hop", 100)),
                    graphs=flow_graphs,
                    cache_bytes=number_option(options, "flow_cache_bytes", 0, allow_zero=True),
                    schedule=schedule,
                    masked_last=choice_option(options, "flow_last_call", ("full", "masked")) == "masked",
                    cache_graphs=flag_option(options, "flow_cache_graphs", False),
                ),
                ("cond", "tokens"),
                ("mel",),
                options=dict(batch_options),
            ),
            StageSpec(
                "hift",
                "batch",
                make(hift_factory, checkpoint_dir=path, dtype=hift_dtype, graphs=hift_graphs, schedule=schedule),
                ("mel",),
                ("audio",),
                options=dict(batch_options),
            ),
        ],
        edges=[
            Edge("frontend.llm", "llm.in"),
            Edge("frontend.cond", "flow.cond"),
            Edge("llm.tokens", "flow.tokens", kind="stream"),
            Edge("flow.mel", "hift.mel", kind="stream"),
        ],
        entry="frontend.in",
        outputs={"audio": "hift.audio"},
    )
