"""A stream of a stage's own (a vocoder, a flow model, an AR engine that asks for one), so its
work overlaps other stages' instead of queueing behind them on the device's default stream; a
no-op on a platform without streams (the CPU).

Work on two streams is ordered only where it is made so. Stages hand each other host data
(tokens, codes, audio) as a rule; a device tensor a stage receives goes through ``adopt``, which
orders the stage's stream after the default stream (where the encoders that send them run) and
keeps the tensor's memory from being reused while this stream may still read it."""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from omni_core.platforms import platform_for


class StageStream:
    """``with stream(): ...`` runs the block on the stage's stream. The stream is made on first
    use: stages start in parallel, and an AR engine's graph capture forbids other threads' syncs
    while it runs."""

    def __init__(self, device: torch.device | str, high_priority: bool = False):
        self.device, self.stream = torch.device(device), None
        self.high_priority = high_priority
        self.platform = platform_for(self.device)

    def __call__(self):
        if not self.platform.accelerator:
            return nullcontext()
        if self.stream is None:
            self.stream = self.platform.new_stream(self.device, high_priority=self.high_priority)
            self.platform.synchronize(self.device)  # weights were copied on the default stream
        return self.platform.use_stream(self.stream) if self.stream is not None else nullcontext()

    def adopt(self, payload: Any) -> Any:
        """``payload`` (a message's), made safe to read on this stream: inside ``with self():``."""
        if self.stream is None:
            return payload
        tensors = [t for t in _tensors(payload) if t.device.type != "cpu"]
        if tensors:
            self.stream.wait_stream(self.platform.default_stream(self.device))
            for t in tensors:
                t.record_stream(self.stream)
        return payload


def _tensors(value: Any):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, (torch.Tensor, dict, list, tuple)):
                yield from _tensors(v)
