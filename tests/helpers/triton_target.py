"""Where the Triton kernel tests run: on CPU tensors in float32 under ``TRITON_INTERPRET=1`` (the
suite does that in a subprocess, see tests/core/models/test_backend_selection.py), on CUDA in
bfloat16 when triton imports, else nowhere (``requires_triton_target`` skips)."""

import os

import pytest
import torch
from omni_core.models import kernels

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if INTERPRET:
    DEVICE, DTYPE = "cpu", torch.float32
elif torch.cuda.is_available() and kernels.triton_available():
    DEVICE, DTYPE = "cuda", torch.bfloat16
else:
    DEVICE = DTYPE = None

requires_triton_target = pytest.mark.skipif(DEVICE is None, reason="needs TRITON_INTERPRET=1 (run by test_backend_selection.py) or CUDA with triton")

# bfloat16 results round once in the kernels and once or twice per op in torch
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
