"""How an engine picks its attention backend, and the Triton kernel tests run under Triton's CPU
interpreter (in a subprocess: the interpreter is chosen when triton is imported, and must not
reach other tests)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omni_core.models import SdpaBackend, TritonPagedBackend, kernels, resolve_attention_backend
from omni_core.models.paged_backend import BACKEND_ENV
from omni_core.scheduler import AREngine, EngineConfig

ROOT = Path(__file__).resolve().parents[3]


def test_default_is_sdpa_off_cuda_and_names_and_objects_resolve(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert isinstance(resolve_attention_backend(None, torch.device("cpu")), SdpaBackend)
    assert isinstance(resolve_attention_backend("sdpa", "cuda"), SdpaBackend)
    mine = TritonPagedBackend(num_splits=2)
    assert resolve_attention_backend(mine, "cpu") is mine
    with pytest.raises(ValueError, match="unknown attention backend 'flash'"):
        resolve_attention_backend("flash", "cpu")


def test_environment_variable_forces_a_backend(monkeypatch):
    monkeypatch.setenv(BACKEND_ENV, "sdpa")
    assert isinstance(resolve_attention_backend(None, "cuda"), SdpaBackend)
    monkeypatch.setenv(BACKEND_ENV, "nope")
    with pytest.raises(ValueError, match="'nope'"):
        resolve_attention_backend(None, "cpu")


def test_triton_off_cuda_is_a_clear_error(monkeypatch, tiny_qwen2):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="attention backend 'triton'"):
        AREngine(tiny_qwen2, EngineConfig(num_kv_blocks=8, attention_backend="triton"))
    engine = AREngine(tiny_qwen2, EngineConfig(num_kv_blocks=8))
    assert engine.runner.backend.name == "sdpa"


@pytest.fixture
def tiny_qwen2():
    import transformers
    from omni_core.models import random_causal_lm

    config = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128)
    config.architectures = ["Qwen2ForCausalLM"]
    return random_causal_lm(config)


@pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")
def test_kernels_under_the_triton_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "OMP_NUM_THREADS": "1"}
    env.pop(BACKEND_ENV, None)
    # --noconftest: the directory's conftest imports transformers for other tests' checkpoints
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/core/models/test_triton_kernels.py", "tests/core/models/test_fused_linear.py", "tests/core/models/test_fused_moe.py",
         "tests/plugins/qwen3_omni/test_code_predictor_kernels.py", "tests/plugins/fish_s2pro/test_fast_ar_kernels.py", "-q", "-p", "no:cacheprovider", "--noconftest"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-2000:]
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 40 and "skipped" not in summary, summary


@pytest.mark.skipif(not kernels.triton_available(), reason="triton is not installed")
def test_fused_tiles_read_from_the_environment(monkeypatch):
    from omni_core.models.kernels import fused_linear

    monkeypatch.setenv(fused_linear.TILES_ENV, "linear=4,8,0; linear4864=2,4,4096,0;gate_up=16")
    fused_linear.tile_override.cache_clear()
    try:
        assert fused_linear.tile_override("linear", 4864) == (2, 4, 4096, False)  # the K-specific entry wins
        assert fused_linear.tile_override("linear", 896) == (4, 8, None, None)  # 0 keeps the default size
        assert fused_linear.tile_override("gate_up", 896) == (16, None, None, None)
        assert fused_linear.tile_override("qkv", 896) == (None, None, None, None)
        # a caller's explicit tile wins over the environment; early launch defaults to on
        assert fused_linear._tile("linear", 896, None, None, 2048, None) == (4, 8, 2048, True)
        assert fused_linear._tile("linear", 4864, None, None, None, True) == (2, 4, 4096, True)
        monkeypatch.setenv(fused_linear.TILES_ENV, "qkv=4,four")
        fused_linear.tile_override.cache_clear()
        with pytest.raises(ValueError, match="OMNI_FUSED_TILES: cannot read 'qkv=4,four'"):
            fused_linear.tile_override("qkv", 896)
    finally:
        fused_linear.tile_override.cache_clear()
