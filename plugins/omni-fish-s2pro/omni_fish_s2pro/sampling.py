"""How both ARs draw, batched over a step's rows, each row with its request's temperature, top-p,
top-k and seed (the core sampler's counter-based draws, so a request's draws do not depend on
what it is batched with); temperature 0 is greedy.

The slow AR samples as the reference does, repetition-aware: a semantic token drawn normally that
is among the row's last ``RAS_WINDOW`` tokens is replaced by a second draw at temperature
``RAS_TEMPERATURE`` and top-p ``RAS_TOP_P`` (same top-k), which breaks loops. The fast AR draws
its codes with the same settings, no repetition rule.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from omni_core.scheduler.host_copy import to_device
from omni_core.scheduler.sampler import Sampler, SamplingTensors, greedy
from omni_core.scheduler.sampling_params import SamplingParams

RAS_WINDOW, RAS_TEMPERATURE, RAS_TOP_P = 10, 1.0, 0.9
# the draws of one step use different counters: the slow AR's own, its repetition redraw, each fast codebook
RAS_DRAWS, FAST_DRAWS = 1 << 21, 1 << 20


@dataclass(frozen=True)
class FastPath:
    any_top_k: bool
    any_top_p: bool
    any_greedy: bool
    max_top_k: int
    all_top_k: bool


class StepSampler:
    def __init__(self, device: torch.device, num_codebooks: int):
        self.device = device
        self.num_codebooks = num_codebooks
        self.sampler = Sampler()

    def _tensors(
        self, params: list[SamplingParams], seeds: list[int], temperature=None, top_p=None
    ) -> SamplingTensors:
        temps = [p.temperature if temperature is None or p.temperature == 0 else temperature for p in params]
        tops = [p.top_p if top_p is None else top_p for p in params]
        ints = to_device(torch.tensor([seeds, [p.top_k for p in params]], dtype=torch.int64), self.device)
        floats = to_device(torch.tensor([temps, tops], dtype=torch.float32), self.device)
        return SamplingTensors(
            temperature=floats[0], top_k=ints[1], top_p=floats[1], min_p=None, seeds=ints[0], steps=None,
            all_greedy=False, any_top_k=any(p.top_k > 0 for p in params), any_top_p=any(t < 1 for t in tops),
            any_min_p=False, any_greedy=any(t == 0 for t in temps), max_top_k=max(p.top_k for p in params),
            all_top_k=all(p.top_k > 0 for p in params),
        )  # fmt: skip

    def semantic(
        self,
        logits: torch.Tensor,
        params: list[SamplingParams],
        seeds: list[int],
        done: list[int],
        recent: torch.Tensor,
        is_semantic: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """The slow AR's tokens [N] from its logits [N, V]; ``recent`` [N, RAS_WINDOW]: each row's last tokens."""
        if all(p.temperature == 0 for p in params):
            return greedy(logits)
        steps = to_device(torch.tensor(done, dtype=torch.int64), self.device)
        normal = self._tensors(params, seeds)
        normal.steps = steps
        redraw = self._tensors(params, seeds, RAS_TEMPERATURE, RAS_TOP_P)
        redraw.steps = steps + RAS_DRAWS
        first, second = self.sampler(logits, normal), self.sampler(logits, redraw)
        repeated = (recent == first[:, None]).any(dim=1) & is_semantic(first)
        return torch.where(repeated, second, first)

    def fast_path(self, params: list[SamplingParams]) -> FastPath | None:
        """Which sampler path the fast AR's draws take for these rows (None: every row greedy): the
        flags ``Sampler`` branches on, so that a CUDA graph captured for one path serves any rows
        that take it (``fast_ar_graphs``)."""
        if all(p.temperature == 0 for p in params):
            return None
        # the largest top-k rounded up to a power of two: drawing among more candidates draws the
        # same tokens (each row keeps its own top-k), and a client's top_k of 1..64 then makes 7
        # paths to capture, not 64
        largest = max(p.top_k for p in params)
        return FastPath(
            any_top_k=any(p.top_k > 0 for p in params), any_top_p=any(p.top_p < 1 for p in params),
            any_greedy=any(p.temperature == 0 for p in params), max_top_k=1 << (largest - 1).bit_length() if largest > 0 else 0,
            all_top_k=all(p.top_k > 0 for p in params),
        )  # fmt: skip

    @staticmethod
    def fast_rows(params: list[SamplingParams], seeds: list[int], done: list[int]):
        """The rows' settings as host tensors: ints [3, N] (seed, top-k, frames done) and floats
        [2, N] (temperature, top-p)."""
        ints = torch.tensor([seeds, [p.top_k for p in params], done], dtype=torch.int64)
        floats = torch.tensor([[p.temperature for p in params], [p.top_p for p in params]], dtype=torch.float32)
        return ints, floats

    def fast_choose(self, path: FastPath, ints: torch.Tensor, floats: torch.Tensor):
        """``choose(logits, codebook)`` from device tensors only (it may run inside a CUDA graph):
        each codebook's draw takes a counter of its own, from the row's frames done."""
        tensors = SamplingTensors(
            temperature=floats[0], top_k=ints[1], top_p=floats[1], min_p=None, seeds=ints[0], steps=None,
            all_greedy=False, any_top_k=path.any_top_k, any_top_p=path.any_top_p, any_min_p=False,
            any_greedy=path.any_greedy, max_top_k=path.max_top_k, all_top_k=path.all_top_k,
        )  # fmt: skip
        frames = ints[2]

        def choose(logits: torch.Tensor, codebook: int) -> torch.Tensor:
            tensors.steps = frames * self.num_codebooks + codebook + FAST_DRAWS
            return self.sampler(logits, tensors)

        return choose

    def fast_chooser(self, params: list[SamplingParams], seeds: list[int], done: list[int]):
        """``choose(logits, codebook)`` for the fast AR run eagerly (None: every row greedy)."""
        path = self.fast_path(params)
        if path is None:
            return None
        ints, floats = self.fast_rows(params, seeds, done)
        return self.fast_choose(path, to_device(ints, self.device), to_device(floats, self.device))
