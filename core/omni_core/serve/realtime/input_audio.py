"""The input audio buffer of a realtime session: pcm16 at the session's rate in, 16 kHz float32
kept (what the voice activity detector reads; a family that wants another rate gets it
resampled again by its transcription path). Positions are samples at 16 kHz since the session
began, so turns are cut where the detector placed them."""

from __future__ import annotations

import base64
import binascii

import numpy as np
import soxr

from omni_core.serve.errors import APIError
from omni_core.serve.realtime.vad import RATE


def decode_pcm16(audio) -> np.ndarray:
    """base64 of 16-bit little-endian mono pcm -> float32 samples."""
    if not isinstance(audio, str):
        raise APIError(
            400, "audio must be a base64 string of pcm16 audio", param="audio", code="invalid_value"
        )
    try:
        data = base64.b64decode(audio, validate=True)
    except (binascii.Error, ValueError):
        raise APIError(400, "audio is not valid base64", param="audio", code="invalid_value") from None
    if len(data) % 2:
        raise APIError(
            400, "pcm16 audio has an even number of bytes (2 a sample)", param="audio", code="invalid_value"
        )
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0


class InputAudioBuffer:
    def __init__(self, rate: int, max_seconds: float):
        self.max_samples = int(max_seconds * RATE)
        self._resampler = None
        self.rate = 0
        self.set_rate(rate)
        self.start = 0  # stream position of the first sample held
        self.end = 0  # stream position after the last sample received
        # appended pieces as they came: joined only when a turn is taken, so a long buffer built
        # of many small appends costs no copy an append
        self._pieces: list[np.ndarray] = []

    def set_rate(self, rate: int) -> None:
        if rate != self.rate:
            self.rate = rate
            self._resampler = None if rate == RATE else soxr.ResampleStream(rate, RATE, 1, dtype="float32")

    def to_16k(self, samples: np.ndarray) -> np.ndarray:
        if self._resampler is None:
            return samples
        return self._resampler.resample_chunk(samples)

    def flush(self) -> np.ndarray:
        """Adds (and returns) what the resampler still holds, its last few milliseconds: the audio
        so far is a turn's whole audio (a commit by hand); the next append starts a new stream."""
        if self._resampler is None:
            return np.zeros(0, np.float32)
        tail = self._resampler.resample_chunk(np.zeros(0, np.float32), last=True)
        self._resampler = soxr.ResampleStream(self.rate, RATE, 1, dtype="float32")
        self.append(tail)
        return tail

    def room(self) -> int:
        return self.max_samples - (self.end - self.start)

    def append(self, samples: np.ndarray) -> None:
        if len(samples):
            self._pieces.append(samples)
            self.end += len(samples)

    def take(self, until: int | None = None) -> np.ndarray:
        """The samples held up to stream position ``until`` (all by default), removed."""
        cut = self.end - self.start if until is None else max(0, min(until, self.end) - self.start)
        taken, count = [], 0
        while self._pieces and count < cut:
            piece = self._pieces.pop(0)
            if count + len(piece) > cut:  # split it: the rest stays
                keep = cut - count
                self._pieces.insert(0, piece[keep:])
                piece = piece[:keep]
            taken.append(piece)
            count += len(piece)
        self.start += count
        return np.concatenate(taken) if taken else np.zeros(0, np.float32)

    def drop_before(self, position: int) -> None:
        """Forgets what lies before stream position ``position``."""
        if position > self.start:
            self.take(position)

    @property
    def seconds(self) -> float:
        return (self.end - self.start) / RATE
