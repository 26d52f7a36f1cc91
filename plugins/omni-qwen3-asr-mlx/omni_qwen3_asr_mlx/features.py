"""Whisper-style log-mel features in numpy (no torch, no torchaudio), settings from the checkpoint.

Centered STFT with reflect padding and a periodic Hann window, power spectrum, Slaney mel
filters (transformers' ``mel_filter_bank``), log10 clamped to 8 decades below the maximum and
scaled to roughly [-1, 1]; the last STFT frame is dropped, as in the reference extractor.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from transformers.audio_utils import mel_filter_bank


@dataclass(frozen=True)
class FeatureSettings:
    sampling_rate: int = 16000
    feature_size: int = 128
    n_fft: int = 400
    hop_length: int = 160
    min_samples: int = 8000  # shorter clips are zero-padded, as the reference does

    @classmethod
    def from_dir(cls, checkpoint_dir: str) -> FeatureSettings:
        path = os.path.join(checkpoint_dir, "preprocessor_config.json")
        if not os.path.exists(path):
            return cls()
        with open(path) as f:
            raw = json.load(f)
        return cls(
            sampling_rate=raw.get("sampling_rate", 16000),
            feature_size=raw.get("feature_size", 128),
            n_fft=raw.get("n_fft", 400),
            hop_length=raw.get("hop_length", 160),
            min_samples=raw.get("min_length", 8000),
        )


class LogMel:
    def __init__(self, settings: FeatureSettings):
        self.settings = settings

    @cached_property
    def filters(self) -> np.ndarray:  # [freq bins, mel bins]
        s = self.settings
        return mel_filter_bank(
            num_frequency_bins=1 + s.n_fft // 2,
            num_mel_filters=s.feature_size,
            min_frequency=0.0,
            max_frequency=s.sampling_rate / 2,
            sampling_rate=s.sampling_rate,
            norm="slaney",
            mel_scale="slaney",
        ).astype(np.float32)

    @cached_property
    def window(self) -> np.ndarray:
        n = self.settings.n_fft
        return (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)).astype(np.float32)

    def frames_for(self, samples: int) -> int:
        return max(samples, self.settings.min_samples) // self.settings.hop_length

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """``audio``: float32 mono at ``sampling_rate`` -> [feature_size, frames] float32."""
        s = self.settings
        audio = np.asarray(audio, dtype=np.float32).reshape(-1)
        if audio.size < s.min_samples:
            audio = np.pad(audio, (0, s.min_samples - audio.size))
        half = s.n_fft // 2
        padded = np.pad(audio, (half, half), mode="reflect")
        count = 1 + (padded.size - s.n_fft) // s.hop_length
        frames = np.lib.stride_tricks.as_strided(
            padded,
            shape=(count, s.n_fft),
            strides=(padded.strides[0] * s.hop_length, padded.strides[0]),
        )
        spectrum = np.fft.rfft(frames * self.window, axis=-1)
        power = (spectrum.real**2 + spectrum.imag**2).astype(np.float32)[:-1]
        mel = power @ self.filters
        log_mel = np.log10(np.maximum(mel, 1e-10))
        log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
        return ((log_mel + 4.0) / 4.0).T.astype(np.float32, copy=False)
