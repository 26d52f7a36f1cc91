"""CUDA graphs of a whole model call per padded (batch, frames) bucket.

The flow's Euler loop and the vocoder are launch-bound on a GPU: the same call costs about the
same whether it holds 50 frames or 500. ``GraphBuckets`` captures a function once per bucket
(batch sizes and frame counts, each rounded up to the next bucket) into graphs that share one
memory pool, copies each call's padded inputs into the bucket's static buffers and replays.
Buckets are captured lazily on first use, or ahead for a list of warm buckets; a call larger
than the largest bucket, or whose bucket holds more than ``max_work`` frames over all rows,
returns None and the caller runs eagerly: such calls are bound by arithmetic, not launches, so a
graph would gain little and its padding and memory pool would cost much.

Captures hold the process-wide capture lock of ``omni_core.scheduler.graph_capture`` and use
CUDA's ``thread_local`` mode, so warm buckets are captured while the stage starts, beside the
other stages' start-up (the llm engine captures its own graphs under the same lock).

The model supplies ``pad(inputs, batch, frames)``: it pads a call's inputs to a bucket so that
the real rows' real frames come out as they would unpadded (right padding masked or past a
causal edge); tests check that on the CPU, where no graph runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from omni_core.scheduler.graph_capture import CUDA_GRAPH_CAPTURE_LOCK

log = logging.getLogger(__name__)


Inputs = dict[str, torch.Tensor]


def parse_buckets(text: str | Iterable[int]) -> tuple[int, ...]:
    """'64,128,256' (or a list of ints) -> sorted unique positive sizes."""
    items = text.split(",") if isinstance(text, str) else list(text)
    sizes = sorted({int(x) for x in items if str(x).strip()})
    if not sizes or sizes[0] < 1:
        raise ValueError(f"bucket sizes must be positive integers, got {text!r}")
    return tuple(sizes)


def parse_warm(text: str, batches: tuple[int, ...], frames: tuple[int, ...]) -> list[tuple[int, int]]:
    """Warm buckets: 'all', 'none', 'batch1' (every frame bucket at batch 1) or 'BxT,BxT'."""
    text = text.strip().lower()
    if text in ("", "none"):
        return []
    if text == "all":
        return [(b, t) for b in batches for t in frames]
    if text == "batch1":
        return [(batches[0], t) for t in frames]
    warm = []
    for item in text.split(","):
        b, _, t = item.strip().partition("x")
        if not (b.isdigit() and t.isdigit()):
            raise ValueError(f"warm graph bucket {item!r} is not BATCHxFRAMES (e.g. 1x128)")
        warm.append((int(b), int(t)))
    return warm


def round_up(value: int, sizes: tuple[int, ...]) -> int | None:
    return next((s for s in sizes if s >= value), None)


class GraphBuckets:
    """``fn(**inputs) -> Tensor`` captured per (batch, frames) bucket; see the module doc."""

    def __init__(
        self,
        fn: Callable[..., torch.Tensor],
        pad: Callable[..., Inputs],  # (inputs, batch, frames, *more)
        example: Callable[..., Inputs],  # (batch, frames, *more)
        batches: tuple[int, ...],
        frames: tuple[int, ...],
        device: torch.device,
        name: str = "model",
        max_work: int | None = None,
    ):
        self.fn, self.pad, self.example = fn, pad, example
        self.batches, self.frames = batches, frames
        self.device, self.name = device, name
        self.max_work = max_work  # batch x frames of the largest bucket worth a graph
        self.graphs: dict[tuple[int, ...], tuple[torch.cuda.CUDAGraph, Inputs, torch.Tensor]] = {}
        self.pool = None
        self.capture_seconds = 0.0

    def bucket(self, batch: int, frames: int, *more: int) -> tuple[int, ...] | None:
        """The bucket of a call: batch and frames (and any further frame counts, e.g. the keys
        of a call whose queries are ``frames``) each rounded up; None past the largest."""
        key = (round_up(batch, self.batches), *(round_up(f, self.frames) for f in (frames, *more)))
        if None in key or (self.max_work is not None and key[0] * key[1] > self.max_work):
            return None
        return key

    @torch.inference_mode()
    def capture(self, batch: int, frames: int, *more: int) -> None:
        key = self.bucket(batch, frames, *more)
        if key is None:
            raise ValueError(f"{self.name}: {(batch, frames, *more)} is beyond the largest graph bucket")
        if key in self.graphs:
            return
        start = time.perf_counter()
        with CUDA_GRAPH_CAPTURE_LOCK:
            static = {k: v.clone() for k, v in self.example(*key).items()}
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self.fn(**static)  # warm-up outside the graph: kernel selection, lazy init
            torch.cuda.current_stream(self.device).wait_stream(side)
            torch.cuda.synchronize(self.device)
            graph = torch.cuda.CUDAGraph()
            # thread_local: other stages' threads keep running (and syncing) during the capture
            with torch.cuda.graph(graph, pool=self.pool, stream=side, capture_error_mode="thread_local"):
                out = self.fn(**static)
            self.pool = graph.pool()
            torch.cuda.synchronize(self.device)
        self.graphs[key] = (graph, static, out)
        self.capture_seconds += time.perf_counter() - start
        log.info(
            "%s: captured a CUDA graph for %s in %.2f s",
            self.name,
            "x".join(map(str, key)),
            time.perf_counter() - start,
        )

    def warm(self, buckets: Iterable[tuple[int, ...]]) -> None:
        """Capture these buckets now (those past ``max_work`` run eagerly: skipped)."""
        for key in buckets:
            if self.bucket(*key) is not None:
                self.capture(*key)
        if self.graphs:  # what the graphs hold is what a flow cache or KV budget cannot have
            log.info("%s: %d graphs warm; their memory pool holds %.1f GiB", self.name, len(self.graphs), self.pool_bytes() / 2**30)

    def pool_bytes(self) -> int:
        """Device memory reserved for the graphs' shared pool."""
        if self.pool is None:
            return 0
        segments = torch.cuda.memory_snapshot()
        return sum(s["total_size"] for s in segments if tuple(s.get("segment_pool_id", ())) == tuple(self.pool))

    @torch.inference_mode()
    def run(self, inputs: Inputs, batch: int, frames: int, *more: int) -> torch.Tensor | None:
        """The padded output's first ``batch`` rows (a copy), or None past the largest bucket."""
        key = self.bucket(batch, frames, *more)
        if key is None:
            return None
        if key not in self.graphs:
            self.capture(*key)
        graph, static, out = self.graphs[key]
        for name, value in self.pad(inputs, *key).items():
            static[name].copy_(value, non_blocking=True)
        graph.replay()
        return out[:batch].clone()

    def stats(self) -> dict[str, Any]:
        return {"graphs": sorted(self.graphs), "capture_seconds": round(self.capture_seconds, 2)}
