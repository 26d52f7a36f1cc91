"""The fast AR of a whole slow step as one CUDA graph replay.

After each slow step the fast AR runs ``num_codebooks - 1`` passes of its layers, one after the
other, each a few small kernels, plus a draw per codebook: launched one by one they cost far more
than they compute on a GPU, whatever the batch. Captured once per padded batch size and sampler
path (``sampling.FastPath``: greedy, or the flags the core sampler branches on), a replay
launches them all at once. Greedy and the stage's default sampling are captured at start-up for
every size up to the stage's batch; a path first met later is captured then, up to
``MAX_GRAPHS`` graphs, past which it runs eagerly. Padding rows compute codes nobody reads, with
settings that keep their draws finite (temperature 1, top-p 1, the path's top-k).

Only where the device's platform captures graphs (``Platform.supports_graphs``: CUDA).
"""

from __future__ import annotations

import torch
from omni_core.scheduler.graph_capture import capture_cuda_graph
from omni_core.scheduler.host_copy import to_device
from omni_core.scheduler.sampling_params import SamplingParams

from .fast_ar import FastAR
from .sampling import FastPath, StepSampler

SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
MAX_GRAPHS = 64


class FastARGraphs:
    def __init__(self, fast: FastAR, sampling: StepSampler, hidden_size: int, dtype: torch.dtype, fused: bool = False):
        self.fast, self.sampling, self.fused = fast, sampling, fused
        self.hidden_size, self.dtype = hidden_size, dtype
        self.device = next(fast.parameters()).device
        self.pool = torch.cuda.graph_pool_handle()  # graphs replay one at a time: they share memory
        self.graphs: dict[tuple[int, FastPath | None], tuple[torch.cuda.CUDAGraph, dict[str, torch.Tensor]]] = {}

    def capture(self, max_batch: int, defaults: list[SamplingParams]) -> None:
        """Every size up to ``max_batch`` for each of ``defaults``' paths and greedy, now (at
        start-up), not in the middle of a request."""
        paths = {None, *(self.sampling.fast_path([p]) for p in defaults)}
        for path in paths:
            for size in SIZES:
                self.graphs[(size, path)] = self._capture(size, path)
                if size >= max_batch:  # the size a full batch pads to is the last one needed
                    break

    @torch.inference_mode()
    def __call__(
        self,
        hidden: torch.Tensor,
        code0: torch.Tensor,
        params: list[SamplingParams],
        seeds: list[int],
        done: list[int],
    ) -> torch.Tensor:
        """As ``FastAR.forward`` with ``StepSampler.fast_chooser``: the frames' codes [N, num_codebooks]."""
        n = hidden.shape[0]
        path = self.sampling.fast_path(params)
        size = next((s for s in SIZES if s >= n), None)
        key = (size, path)
        if size is not None and key not in self.graphs and len(self.graphs) < MAX_GRAPHS:
            self.graphs[key] = self._capture(size, path)
        if key not in self.graphs:
            return self.fast(hidden, code0, self.sampling.fast_chooser(params, seeds, done), fused=self.fused)
        graph, st = self.graphs[key]
        st["hidden"][:n].copy_(hidden)
        st["code0"][:n].copy_(code0)
        if path is not None:  # one host-to-device copy each for the rows' integer and float settings
            ints, floats = self.sampling.fast_rows(params, seeds, done)
            st["ints"][:, :n].copy_(to_device(ints, self.device))
            st["floats"][:, :n].copy_(to_device(floats, self.device))
        graph.replay()
        return st["codes"][:n].clone()  # the rows' frames outlive the next replay

    @torch.inference_mode()
    def _capture(self, size: int, path: FastPath | None):
        device = self.device
        ints = torch.zeros(3, size, dtype=torch.int64, device=device)  # seed, top-k, frames done
        if path is not None:
            ints[1] = path.max_top_k
        st = {
            "hidden": torch.zeros(size, self.hidden_size, dtype=self.dtype, device=device),
            "code0": torch.zeros(size, dtype=torch.int64, device=device),
            "ints": ints,
            "floats": torch.ones(2, size, dtype=torch.float32, device=device),  # temperature, top-p
        }

        def step() -> torch.Tensor:
            choose = None if path is None else self.sampling.fast_choose(path, st["ints"], st["floats"])
            return self.fast(st["hidden"], st["code0"], choose, fused=self.fused)

        graph, st["codes"] = capture_cuda_graph(step, device, self.pool)
        return graph, st
