"""The three audio features CosyVoice3's frontend needs, computed with torch/numpy (no torchaudio).

- ``prompt_mel``: 24 kHz -> 80-bin log mel at 50 Hz (n_fft 1920, hop 480, slaney mel, reflect
  padding of (n_fft - hop) / 2, no centring), the flow's conditioning and the vocoder's input.
- ``whisper_log_mel``: 16 kHz -> 128-bin Whisper log mel at 100 Hz, the speech tokenizer's input.
- ``kaldi_fbank``: 16 kHz -> 80-bin Kaldi filterbank (25 ms povey window, 10 ms shift,
  pre-emphasis 0.97), mean-normalised over time, the speaker model's input.
Filterbanks come from transformers' audio_utils.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from transformers.audio_utils import mel_filter_bank, spectrogram, window_function


def resample(audio: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    audio = np.asarray(audio, dtype=np.float32)
    if rate_in == rate_out:
        return audio
    import soxr  # only references need resampling

    return soxr.resample(audio, rate_in, rate_out).astype(np.float32)


@lru_cache(maxsize=8)
def _slaney_filters(n_fft: int, n_mels: int, sample_rate: int, fmax: float) -> torch.Tensor:
    bank = mel_filter_bank(n_fft // 2 + 1, n_mels, 0.0, fmax, sample_rate, norm="slaney", mel_scale="slaney")
    return torch.from_numpy(bank.T.astype(np.float32))  # [n_mels, bins]


def prompt_mel(audio_24k: np.ndarray, n_fft: int = 1920, hop: int = 480, n_mels: int = 80) -> torch.Tensor:
    """[frames, 80] log mel, frames = len(audio) // hop."""
    x = torch.from_numpy(np.asarray(audio_24k, dtype=np.float32))[None, None]
    pad = (n_fft - hop) // 2
    x = torch.nn.functional.pad(x, (pad, pad), mode="reflect").squeeze(1)
    spec = torch.stft(
        x, n_fft, hop, n_fft, window=torch.hann_window(n_fft), center=False, return_complex=True
    )
    magnitude = torch.sqrt(spec.real.pow(2) + spec.imag.pow(2) + 1e-9)
    mel = _slaney_filters(n_fft, n_mels, 24000, 12000.0) @ magnitude[0]
    return torch.log(mel.clamp(min=1e-5)).T.contiguous()


def whisper_log_mel(audio_16k: np.ndarray, n_mels: int = 128) -> np.ndarray:
    """[n_mels, frames] float32, Whisper's normalisation (log10, 8 decades of range, (x + 4) / 4)."""
    x = torch.from_numpy(np.asarray(audio_16k, dtype=np.float32))
    spec = torch.stft(x, 400, 160, window=torch.hann_window(400), return_complex=True)
    power = spec[..., :-1].abs() ** 2
    mel = _slaney_filters(400, n_mels, 16000, 8000.0) @ power
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    return ((log_spec + 4.0) / 4.0).numpy().astype(np.float32)


@lru_cache(maxsize=1)
def _kaldi_bank() -> tuple[np.ndarray, np.ndarray]:
    bank = mel_filter_bank(
        257, 80, 20, 8000, 16000, norm=None, mel_scale="kaldi", triangularize_in_mel_space=True
    )
    return bank, window_function(400, "povey", periodic=False)


def kaldi_fbank(audio_16k: np.ndarray) -> np.ndarray:
    """[frames, 80] float32 log filterbank, mean over time removed."""
    bank, window = _kaldi_bank()
    feats = spectrogram(
        np.asarray(audio_16k, dtype=np.float32),
        window,
        frame_length=400,
        hop_length=160,
        fft_length=512,
        power=2.0,
        center=False,
        preemphasis=0.97,
        mel_filters=bank,
        log_mel="log",
        mel_floor=1.192092955078125e-07,
        remove_dc_offset=True,
    ).T
    return (feats - feats.mean(axis=0, keepdims=True)).astype(np.float32)
