"""Where the one-kernel batch-1 decode (``kernels.decode_step``) applies and how it lays out a
block's shared memory: host-side rules, checked without a GPU (the kernel itself is tested on
Hopper in test_decode_step_kernel.py)."""

from types import SimpleNamespace

import pytest
import torch
from omni_core.models import Qwen2ForCausalLM
from omni_core.models.kernels import decode_step
from omni_core.models.kernels.decode_step import StepShape

H200_SHARED = 232448  # bytes of shared memory a block may opt in to on Hopper
QWEN2_05B = StepShape(hidden=896, heads=14, kv_heads=2, head_dim=64, inter=4864, layers=24, kv_block=16, has_bias=True)


def test_the_05b_shape_fits_a_hopper_block():
    layout = QWEN2_05B.layout(132)
    # 37 of the 4864 gate/up row pairs and 7 of the 896 down_proj rows a block, in bf16; 10 q/k/v
    # rows (5 column pairs) over 8 warps: two a warp at most
    assert layout["X_BYTES"] == 2 * 37 * 896 * 2 and layout["Y_BYTES"] == 7 * 4864 * 2 and layout["A_ROWS"] == 2
    assert layout["shared"] <= H200_SHARED
    assert QWEN2_05B.unsupported(132, H200_SHARED) is None


@pytest.mark.parametrize(
    "changes,blocks,limit,reason",
    [
        (dict(head_dim=128, heads=7), 132, H200_SHARED, "head size"),
        (dict(hidden=960), 132, H200_SHARED, "multiples"),
        (dict(inter=4800), 132, H200_SHARED, "multiples"),
        ({}, 60, H200_SHARED, "too few"),  # more rows a block than warps, and more splits than blocks
        ({}, 132, 160 * 1024, "shared memory"),
    ],
)
def test_shapes_it_rejects(changes, blocks, limit, reason):
    shape = StepShape(**{**QWEN2_05B.__dict__, **changes})
    assert reason in shape.unsupported(blocks, limit)


def test_off_by_default_and_on_hopper_only(monkeypatch):
    config = SimpleNamespace(
        vocab_size=64, hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(config)
    caches = [(torch.zeros(32, 1, 64), torch.zeros(32, 1, 64))]
    reason = decode_step.DecodeStepKernel.unsupported_reason
    monkeypatch.delenv(decode_step.DECODE_STEP_ENV, raising=False)
    assert decode_step.DECODE_STEP_ENV in reason(model, caches, 16, torch.device("cpu"))
    monkeypatch.setenv(decode_step.DECODE_STEP_ENV, "1")
    assert "Hopper" in reason(model, caches, 16, torch.device("cpu"))
    assert decode_step.DecodeStepKernel.build(model, caches, 16, torch.device("cpu")) is None
