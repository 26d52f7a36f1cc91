"""Host tensors onto the device without waiting for the device.

A copy from pageable host memory may wait for everything queued on the stream, which would stall
a step launched while the previous one still runs (overlapped decode). Pinned memory lets the
copy queue behind that work instead; torch keeps a pinned block until its copy is done.
"""

from __future__ import annotations

import torch


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    device = torch.device(device)
    if device.type != "cuda":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)
