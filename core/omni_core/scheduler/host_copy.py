"""Copies between host and device that do not hold up other threads.

To the device: a copy from pageable host memory may wait for everything queued on the stream,
which would stall a step launched while the previous one still runs (overlapped decode). Pinned
memory lets the copy queue behind that work instead; torch keeps a pinned block until its copy
is done.

To the host: ``to_host`` queues the copy into pinned memory and waits on an event, whose wait
(torch's ``Event.synchronize``) releases Python's GIL, so the other stage threads of the process
run their Python meanwhile; a blocking ``.cpu()`` is not documented to.

Both apply to accelerators (their platform's ``accelerator``); on the host a copy is a plain one.
"""

from __future__ import annotations

import torch

from omni_core.platforms import platform_for


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    device = torch.device(device)
    if not platform_for(device).accelerator:
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def to_host(t: torch.Tensor) -> torch.Tensor:
    host = to_host_later(t)
    done = platform_for(t.device).record_event() if host is not t else None
    if done is not None:
        done.synchronize()
    return host


def to_host_later(t: torch.Tensor) -> torch.Tensor:
    """The copy queued into pinned memory, without waiting: valid once the stream's later work
    is waited for (an engine step's tokens, read after its hooks' outputs were queued)."""
    if not platform_for(t.device).accelerator:
        return t
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    return host
