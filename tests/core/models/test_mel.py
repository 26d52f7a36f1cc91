"""The shared log-mel features equal transformers' WhisperFeatureExtractor (80 and 128 bins)."""

import numpy as np
import pytest
import torch
from omni_core.models.mel import log_mel
from transformers import WhisperFeatureExtractor


@pytest.mark.parametrize("n_mels", [80, 128])
@pytest.mark.parametrize("samples", [400, 12345, 16000, 48160])
def test_log_mel_equals_whisper_feature_extractor(n_mels, samples):
    audio = (np.random.default_rng(samples).standard_normal(samples) * 0.1).astype(np.float32)
    ref = WhisperFeatureExtractor(feature_size=n_mels)(audio, sampling_rate=16000, padding=True, return_tensors="np")
    ours = log_mel(torch.from_numpy(audio), n_mels).numpy()
    assert ours.shape == (n_mels, samples // 160)
    np.testing.assert_allclose(ours, ref["input_features"][0][:, : ours.shape[1]], atol=1e-5)


def test_batched_clips_are_each_normalised_on_their_own():
    loud, quiet = torch.randn(16000), torch.randn(16000) * 1e-3
    batched = log_mel(torch.stack([loud, quiet]), 128)
    torch.testing.assert_close(batched[0], log_mel(loud, 128))
    torch.testing.assert_close(batched[1], log_mel(quiet, 128))
