"""A realtime session's input audio buffer: pcm16 decoded (bad base64 and odd lengths refused),
resampled to 16 kHz, and turns taken by stream position from pieces appended in any sizes."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from omni_core.serve.errors import APIError
from omni_core.serve.realtime.input_audio import InputAudioBuffer, decode_pcm16


def test_turns_are_taken_by_stream_position():
    buffer = InputAudioBuffer(16000, max_seconds=1)
    stream = np.arange(5000, dtype=np.float32)
    for offset in range(0, len(stream), 300):
        buffer.append(stream[offset : offset + 300])
    assert buffer.room() == 16000 - 5000
    buffer.drop_before(1000)
    assert buffer.start == 1000
    assert np.array_equal(buffer.take(2345), stream[1000:2345])  # cut inside an appended piece
    assert np.array_equal(buffer.take(), stream[2345:])
    assert buffer.seconds == 0 and buffer.room() == 16000 and buffer.start == buffer.end == 5000


def test_session_rate_audio_is_resampled_whole_once_flushed():
    buffer = InputAudioBuffer(24000, max_seconds=5)
    tone = np.sin(2 * np.pi * 440 * np.arange(24000) / 24000).astype(np.float32) * 0.5
    for offset in range(0, len(tone), 2400):  # 100 ms pieces
        buffer.append(buffer.to_16k(tone[offset : offset + 2400]))
    buffer.flush()
    turn = buffer.take()
    assert len(turn) == 16000  # one second at 16 kHz, the resampler's held samples included
    expected = np.sin(2 * np.pi * 440 * np.arange(16000) / 16000) * 0.5
    assert np.abs(turn[200:-200] - expected[200:-200]).max() < 0.02


def test_pcm16_is_decoded_and_bad_audio_refused():
    samples = np.array([0, 16384, -32768, 32767], "<i2")
    decoded = decode_pcm16(base64.b64encode(samples.tobytes()).decode())
    assert np.allclose(decoded, [0.0, 0.5, -1.0, 32767 / 32768])
    for bad in ("%%%", base64.b64encode(b"abc").decode(), 5, None):
        with pytest.raises(APIError) as refused:
            decode_pcm16(bad)
        assert refused.value.status == 400 and refused.value.param == "audio"
