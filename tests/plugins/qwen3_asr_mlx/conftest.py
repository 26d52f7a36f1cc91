"""Shared fixtures: one tiny random Qwen3-ASR checkpoint per test session, written by
transformers' save_pretrained (the transformers layout), and deterministic test audio."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("omni_qwen3_asr_mlx")  # first: it chooses MLX's BLAS before mlx.core loads
pytest.importorskip("mlx.core")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    from omni_qwen3_asr_mlx.presets import write_tiny

    return str(write_tiny(str(tmp_path_factory.mktemp("qwen3-asr-tiny")), seed=1))


def noise_audio(seconds: float, seed: int = 0) -> np.ndarray:
    """Band-limited noise with a slow envelope: speech-like energy changes, not speech."""
    rng = np.random.default_rng(seed)
    samples = int(seconds * 16000)
    envelope = 0.5 + 0.5 * np.sin(np.linspace(0, 6 * np.pi * seconds, samples))
    return (0.2 * envelope * rng.standard_normal(samples)).astype(np.float32)
