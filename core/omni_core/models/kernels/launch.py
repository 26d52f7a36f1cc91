"""How the fused kernels are launched on a device: programmatic dependent launch (Hopper and
newer), and the multiprocessor count that sizes grids.

With programmatic dependent launch a kernel may launch while the one before it still runs; it
waits (``gdc_wait``) before reading anything the earlier kernel writes, and lets its own
successor launch (``gdc_launch_dependents``; the projection, attention and norm kernels do so as
they start, so the successor's weight reads overlap them). ``OMNI_PDL=0`` turns
it off (read once per process; for comparison, or a driver that mishandles it); under ``TRITON_INTERPRET=1`` (the
kernels on CPU tensors) it is always off.
"""

from __future__ import annotations

import functools
import os

import torch

PDL_ENV = "OMNI_PDL"


@functools.cache
def launch_options(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with programmatic dependent launch (decided once per
    device and process: every kernel launch asks)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get(PDL_ENV) == "0":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


@functools.cache
def multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
