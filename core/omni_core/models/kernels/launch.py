"""How the fused kernels are launched on a device: programmatic dependent launch (Hopper and
newer), and the multiprocessor count that sizes grids.

With programmatic dependent launch a kernel may launch while the one before it is finishing; it
waits (``gdc_wait``) before reading anything the earlier kernel writes, and lets its own
successor launch (``gdc_launch_dependents``) once its main reads are done. ``OMNI_PDL=0`` turns
it off (for comparison, or a driver that mishandles it); under ``TRITON_INTERPRET=1`` (the
kernels on CPU tensors) it is always off.
"""

from __future__ import annotations

import functools
import os

import torch

PDL_ENV = "OMNI_PDL"


@functools.cache
def _capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device)


def launch_options(device: torch.device) -> bool:
    """Whether kernels on ``device`` launch with programmatic dependent launch."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or os.environ.get(PDL_ENV) == "0":
        return False
    return _capability(device)[0] >= 9


@functools.cache
def multiprocessors(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
