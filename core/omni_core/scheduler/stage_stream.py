"""A stream of a non-AR stage's own (a vocoder, a flow model), so its work overlaps the AR
stages' decode steps instead of queueing behind them on the default stream; a no-op on a
platform without streams (the CPU)."""

from __future__ import annotations

from contextlib import nullcontext

import torch

from omni_core.platforms import platform_for


class StageStream:
    """``with stream(): ...`` runs the block on the stage's stream. The stream is made on first
    use: stages start in parallel, and an AR engine's graph capture forbids other threads' syncs
    while it runs."""

    def __init__(self, device: torch.device | str):
        self.device, self.stream = torch.device(device), None
        self.platform = platform_for(self.device)

    def __call__(self):
        if not self.platform.accelerator:
            return nullcontext()
        if self.stream is None:
            self.stream = self.platform.new_stream(self.device)
            self.platform.synchronize(self.device)  # weights were copied on the default stream
        return self.platform.use_stream(self.stream) if self.stream is not None else nullcontext()
