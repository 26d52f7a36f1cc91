"""Whisper's log-mel features in torch (no torchaudio): 16 kHz, 25 ms Hann window, 10 ms hop.

Audio is cut into windows of at most 30 s, each ending at a quiet moment; each window is
zero-padded to 30 s, as Whisper was trained, and becomes ``[n_mels, 3000]`` (the shared
``omni_core.models.mel``: ``WhisperFeatureExtractor``'s features).
"""

from __future__ import annotations

import torch
from omni_core.models.mel import log_mel as shared_log_mel

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
WINDOW_SECONDS = 30
WINDOW_SAMPLES = WINDOW_SECONDS * SAMPLE_RATE
FRAMES_PER_WINDOW = WINDOW_SAMPLES // HOP  # 3000 mel frames; the encoder halves them to 1500


def log_mel(windows: torch.Tensor, n_mels: int = 80) -> torch.Tensor:
    """``windows`` [B, WINDOW_SAMPLES] float32 -> log-mel [B, n_mels, FRAMES_PER_WINDOW]; each window
    is normalised on its own (a dynamic range of 80 dB below its loudest bin)."""
    return shared_log_mel(windows, n_mels, N_FFT, HOP, SAMPLE_RATE)


# a window longer audio is cut into ends at the quietest moment of its last few seconds (the
# lowest energy over a short span), not at a fixed 30 s: a cut then falls between words, where a
# fixed cut splits a word, or leaves the speech after Whisper's last whole segment untranscribed
CUT_SEARCH_SECONDS = 5.0
QUIET_SPAN_SECONDS = 0.3


def window_starts(audio: torch.Tensor) -> list[int]:
    """Where each window starts (samples): every window but the last ends at the middle of the
    quietest ``QUIET_SPAN_SECONDS`` of its last ``CUT_SEARCH_SECONDS`` (the latest such span on
    ties, so windows stay long)."""
    span, search = int(QUIET_SPAN_SECONDS * SAMPLE_RATE), int(CUT_SEARCH_SECONDS * SAMPLE_RATE)
    starts = [0]
    while audio.numel() - starts[-1] > WINDOW_SAMPLES:
        end = starts[-1] + WINDOW_SAMPLES
        power = audio[end - search : end].double().square()
        sums = torch.cat([power.new_zeros(1), power.cumsum(0)])
        energy = (sums[span:] - sums[:-span])[::HOP]  # each span starting every 10 ms
        quietest = len(energy) - 1 - int(torch.argmin(energy.flip(0)))
        starts.append(end - search + quietest * HOP + span // 2)
    return starts


def split_windows(audio: torch.Tensor) -> tuple[torch.Tensor, list[float], list[float]]:
    """Cut 16 kHz mono audio into windows of at most 30 s (``window_starts``), each zero-padded
    to 30 s; returns [W, WINDOW_SAMPLES], each window's duration and its offset in the audio
    (seconds; a window starts where the one before ends)."""
    audio = audio.reshape(-1).float()
    starts = window_starts(audio)
    bounds = [*starts, audio.numel()]
    padded = torch.zeros(len(starts), WINDOW_SAMPLES)
    for index, (start, end) in enumerate(zip(bounds, bounds[1:], strict=False)):
        padded[index, : end - start] = audio[start:end]
    durations = [(end - start) / SAMPLE_RATE for start, end in zip(bounds, bounds[1:], strict=False)]
    return padded, durations, [start / SAMPLE_RATE for start in starts]
