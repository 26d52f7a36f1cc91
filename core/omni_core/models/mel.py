"""Whisper-style log-mel features in torch (no torchaudio), as ``WhisperFeatureExtractor``
computes them: a centered STFT (reflect padding, periodic Hann window), the power spectrum
without its last frame, Slaney mel filters from transformers' ``mel_filter_bank``, log10
clamped to 8 decades below the clip's maximum and scaled to about [-1, 1]. Whisper, Qwen3-ASR
and Qwen3-Omni read audio this way (80 or 128 bins at 16 kHz)."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch


@lru_cache(maxsize=16)
def mel_filters(n_mels: int, n_fft: int = 400, sample_rate: int = 16000, device: str = "cpu") -> torch.Tensor:
    """[n_mels, 1 + n_fft // 2] Slaney-scale, Slaney-normalised filters from 0 Hz to Nyquist."""
    from transformers.audio_utils import mel_filter_bank

    bank = mel_filter_bank(
        num_frequency_bins=1 + n_fft // 2,
        num_mel_filters=n_mels,
        min_frequency=0.0,
        max_frequency=sample_rate / 2,
        sampling_rate=sample_rate,
        norm="slaney",
        mel_scale="slaney",
    )
    return torch.from_numpy(np.ascontiguousarray(bank.T)).float().to(device)


@lru_cache(maxsize=8)
def _window(n_fft: int, device: str) -> torch.Tensor:
    return torch.hann_window(n_fft, device=device)


def log_mel(audio: torch.Tensor, n_mels: int, n_fft: int = 400, hop: int = 160, sample_rate: int = 16000) -> torch.Tensor:
    """``audio`` [n] or [B, n] float32 -> [n_mels, n // hop] or [B, n_mels, n // hop]; each clip
    is clamped against its own maximum."""
    single = audio.dim() == 1
    clips = audio.float()[None] if single else audio.float()
    device = str(clips.device)  # filters and window cached per device: no copy per call
    spec = torch.stft(clips, n_fft, hop, window=_window(n_fft, device), return_complex=True)
    power = spec[..., :-1].abs().square()
    mel = torch.clamp(mel_filters(n_mels, n_fft, sample_rate, device) @ power, min=1e-10).log10()
    mel = torch.maximum(mel, mel.amax(dim=(1, 2), keepdim=True) - 8.0)
    mel = (mel + 4.0) / 4.0
    return mel[0] if single else mel
