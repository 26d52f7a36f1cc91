"""The fast AR on the core's fused kernels against its torch path (same weights, same inputs).

Runs where Triton can: on CPU tensors in float32 under ``TRITON_INTERPRET=1`` (the suite does that
in a subprocess, see tests/core/models/test_backend_selection.py) and on CUDA in bfloat16."""

import dataclasses
import tempfile

import pytest
import torch

from tests.helpers.triton_target import DEVICE, DTYPE, fused_against_torch, on_target, requires_triton_target

pytestmark = requires_triton_target


def _fast_ar(qk_norm: bool):
    from omni_fish_s2pro.config import load_config
    from omni_fish_s2pro.fast_ar import FastAR
    from omni_fish_s2pro.presets import write_full

    cfg = load_config(write_full(tempfile.mkdtemp(prefix="fish-full-")))  # configs only: no weights written
    sizes = dataclasses.replace(cfg.fast, n_layer=2, dim=64, n_head=4, n_local_heads=2, head_dim=16, intermediate_size=96, qk_norm=qk_norm)
    cfg = dataclasses.replace(cfg, fast=sizes, slow=dataclasses.replace(cfg.slow, dim=48), codebook_size=40)
    return on_target(FastAR(cfg)), cfg


@pytest.mark.parametrize("qk_norm", [False, True])
def test_fused_fast_ar_matches_the_torch_path(qk_norm):
    model, cfg = _fast_ar(qk_norm)
    hidden = torch.randn(3, cfg.slow.dim, device=DEVICE, dtype=DTYPE)
    code0 = torch.randint(0, cfg.codebook_size, (3,), device=DEVICE)
    codes, fused_codes = fused_against_torch(lambda choose, fused: model(hidden, code0, choose, fused=fused))
    assert torch.equal(fused_codes, codes) and codes.shape == (3, cfg.num_codebooks)
