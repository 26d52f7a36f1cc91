"""The code predictor on the core's fused kernels against its torch path (same weights, same inputs).

Runs where Triton can: on CPU tensors in float32 under ``TRITON_INTERPRET=1`` (the suite does that
in a subprocess, see tests/core/models/test_backend_selection.py) and on CUDA in bfloat16."""

from types import SimpleNamespace

import torch

from tests.helpers.triton_target import (
    DEVICE,
    DTYPE,
    TOL,
    fused_against_torch,
    on_target,
    requires_triton_target,
)

pytestmark = requires_triton_target


def _predictor():
    from omni_qwen3_omni.code_predictor import CodePredictor

    config = SimpleNamespace(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, hidden_size=48, intermediate_size=64, num_hidden_layers=2,
        rms_norm_eps=1e-6, vocab_size=40, num_code_groups=5, rope_theta=10000.0,
    )
    return on_target(CodePredictor(config))


def test_fused_predictor_matches_the_torch_path():
    model = _predictor()
    hidden = torch.randn(3, 48, device=DEVICE, dtype=DTYPE)
    code0 = torch.randn(3, 48, device=DEVICE, dtype=DTYPE)
    (codes, sums), (fused_codes, fused_sums) = fused_against_torch(lambda choose, fused: model(hidden, code0, choose, fused=fused))
    assert torch.equal(fused_codes, codes) and codes.shape == (3, 4)
    torch.testing.assert_close(fused_sums.float(), sums.float(), **TOL[DTYPE])
