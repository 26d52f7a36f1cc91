"""Whisper's log-mel features in torch (no torchaudio): 16 kHz, 25 ms Hann window, 10 ms hop.

Audio is cut into 30 s windows; each window is zero-padded to 30 s, as Whisper was trained,
and becomes ``[n_mels, 3000]``. The mel filters come from transformers' ``mel_filter_bank``
(Slaney scale and norm, 0-8 kHz), the same bank as ``WhisperFeatureExtractor``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from transformers.audio_utils import mel_filter_bank

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
WINDOW_SECONDS = 30
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
FRAMES_PER_WINDOW = WINDOW_SAMPLES // HOP  # 3000 mel frames; the encoder halves them to 1500


@lru_cache(maxsize=4)
def _filters(n_mels: int) -> torch.Tensor:
    bank = mel_filter_bank(
        num_frequency_bins=1 + N_FFT // 2,
        num_mel_filters=n_mels,
        min_frequency=0.0,
        max_frequency=8000.0,
        sampling_rate=SAMPLE_RATE,
        norm="slaney",
        mel_scale="slaney",
    )
    return torch.from_numpy(np.ascontiguousarray(bank.T)).float()  # [n_mels, freq]


@lru_cache(maxsize=1)
def _window() -> torch.Tensor:
    return torch.hann_window(N_FFT)


def log_mel(windows: torch.Tensor, n_mels: int = 80) -> torch.Tensor:
    """``windows`` [B, WINDOW_SAMPLES] float32 -> log-mel [B, n_mels, FRAMES_PER_WINDOW]."""
    spec = torch.stft(windows, N_FFT, HOP, window=_window(), return_complex=True)
    power = (spec[..., :-1].abs() ** 2).contiguous()
    mel = torch.clamp(_filters(n_mels) @ power, min=1e-10).log10()
    # each window is normalised on its own: a dynamic range of 80 dB below its loudest bin
    mel = torch.maximum(mel, mel.amax(dim=(1, 2), keepdim=True) - 8.0)
    return (mel + 4.0) / 4.0


def split_windows(audio: torch.Tensor) -> tuple[torch.Tensor, list[float]]:
    """Cut 16 kHz mono audio into zero-padded 30 s windows; returns [W, WINDOW_SAMPLES] and each
    window's duration in seconds (the last one may be shorter)."""
    audio = audio.reshape(-1).float()
    count = max(1, -(-audio.numel() // WINDOW_SAMPLES))
    padded = torch.zeros(count * WINDOW_SAMPLES)
    padded[: audio.numel()] = audio
    durations = [
        min(WINDOW_SAMPLES, audio.numel() - i * WINDOW_SAMPLES) / SAMPLE_RATE for i in range(count)
    ]
    return padded.view(count, WINDOW_SAMPLES), durations
