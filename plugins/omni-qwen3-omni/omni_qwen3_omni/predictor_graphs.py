"""The code predictor of a whole talker batch as one CUDA graph replay.

A frame's residual codes take 15 passes of the predictor's layers, one after the other, each a
few small kernels: launched one by one they cost ~45 ms a talker step on an H100 whatever the
batch, ten times the talker's own step. Captured once per padded batch size (and per greedy or
sampled; the sizes up to the talker's batch at start-up), a replay launches them all at once.
Padding rows compute codes nobody reads.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from omni_core.scheduler.graph_capture import CUDA_GRAPH_CAPTURE_LOCK

SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)

# run(hidden [n, H], code0 [n], seeds [n], frames [n], greedy) -> (codes [n, groups - 1], sums [n, H])
Run = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor]]


class PredictorGraphs:
    def __init__(self, run: Run):
        self.run = run
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}

    def capture(self, max_batch: int, greedy: bool, like: torch.Tensor) -> None:
        """Every size up to ``max_batch`` now (at start-up), not in the middle of a request."""
        for size in SIZES:
            self.graphs[(size, greedy)] = self._capture(size, greedy, like)
            if size >= max_batch:  # the size a full batch pads to is the last one needed
                break

    @torch.inference_mode()
    def __call__(self, hidden: torch.Tensor, code0: torch.Tensor, seeds: torch.Tensor, frames: torch.Tensor, greedy: bool):
        n = hidden.shape[0]
        size = next((s for s in SIZES if s >= n), None)
        if size is None:
            return self.run(hidden, code0, seeds, frames, greedy)
        key = (size, greedy)
        if key not in self.graphs:
            self.graphs[key] = self._capture(size, greedy, hidden)
        graph, st = self.graphs[key]
        for name, value in (("hidden", hidden), ("code0", code0), ("seeds", seeds), ("frames", frames)):
            st[name][:n].copy_(value)
        graph.replay()
        # the sums outlive the next replay (the talker's next input reads them)
        return st["codes"][:n], st["sums"][:n].clone()

    @torch.inference_mode()
    def _capture(self, size: int, greedy: bool, like: torch.Tensor):
        device = like.device
        st = {
            "hidden": torch.zeros(size, like.shape[1], dtype=like.dtype, device=device),
            "code0": torch.zeros(size, dtype=torch.int64, device=device),
            "seeds": torch.zeros(size, dtype=torch.int64, device=device),
            "frames": torch.zeros(size, dtype=torch.int64, device=device),
        }

        def step():
            return self.run(st["hidden"], st["code0"], st["seeds"], st["frames"], greedy)

        graph = torch.cuda.CUDAGraph()
        with CUDA_GRAPH_CAPTURE_LOCK:
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):  # warm up kernels and the allocator outside the graph
                for _ in range(2):
                    step()
            torch.cuda.current_stream(device).wait_stream(side)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                st["codes"], st["sums"] = step()
        return graph, st
