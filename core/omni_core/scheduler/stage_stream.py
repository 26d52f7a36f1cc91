"""A CUDA stream of a non-AR stage's own (a vocoder, a flow model), so its work overlaps the AR
stages' decode steps instead of queueing behind them on the default stream; a no-op elsewhere."""

from __future__ import annotations

from contextlib import nullcontext

import torch


class StageStream:
    """``with stream(): ...`` runs the block on the stage's stream. The stream is made on first
    use: stages start in parallel, and an AR engine's graph capture forbids other threads' syncs
    while it runs."""

    def __init__(self, device: torch.device | str):
        self.device, self.stream = torch.device(device), None

    def __call__(self):
        if self.device.type != "cuda":
            return nullcontext()
        if self.stream is None:
            self.stream = torch.cuda.Stream(self.device)
            torch.cuda.synchronize(self.device)  # weights were copied on the default stream
        return torch.cuda.stream(self.stream)
