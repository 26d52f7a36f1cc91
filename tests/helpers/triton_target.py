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


def on_target(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with seeded N(0, 0.3) weights (peaked enough that codes differ), on the target."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.to(DEVICE, DTYPE).eval()


def fused_against_torch(run):
    """``run(choose, fused)`` -> outputs, with ``choose(logits, codebook)`` picking greedily: runs
    the torch path and the fused one, holds that they read the same logits within ``TOL`` at every
    pick, and returns both outputs (torch's first)."""
    logits = {True: [], False: []}

    def greedy(fused):
        def choose(row_logits, codebook):
            logits[fused].append(row_logits.float())
            return row_logits.argmax(-1)
        return choose

    outputs = run(greedy(False), False), run(greedy(True), True)
    assert len(logits[True]) == len(logits[False]) > 0
    for ours, ref in zip(logits[True], logits[False], strict=True):
        torch.testing.assert_close(ours, ref, **TOL[DTYPE])
    return outputs
