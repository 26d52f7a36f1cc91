"""Pieces of the serving layer that need no server: streamed encoders, subtitles, the voice store,
admission control."""

from __future__ import annotations

import asyncio
import io
import os
import tracemalloc

import numpy as np
import pytest
import soundfile as sf
from omni_core.serve.admission import Admission
from omni_core.serve.errors import APIError
from omni_core.serve.exceptions import InputTooLarge, InvalidInput
from omni_core.serve.text_formats import to_srt, to_vtt
from omni_core.surface.audio_codecs import StreamEncoder, decode_audio, encode_audio
from omni_core.surface.voices_store import VoiceStore, VoiceStoreError

TONE = (np.sin(np.arange(24000) / 7) * 0.4).astype(np.float32)


def _streamed(fmt: str, rate: int = 24000) -> bytes:
    encoder = StreamEncoder(fmt, rate)
    return b"".join(encoder.feed(TONE[i : i + 2400]) for i in range(0, len(TONE), 2400)) + encoder.close()


@pytest.mark.parametrize(("fmt", "header_bytes"), [("mp3", 192), ("flac", 42)])
def test_streamed_mp3_and_flac_differ_from_whole_only_in_the_header(fmt, header_bytes):
    # The encoder rewrites its length/seek header on close; a stream cannot, the frames are the same.
    streamed, whole = _streamed(fmt), encode_audio(TONE, 24000, fmt)
    assert len(streamed) == len(whole) and streamed[header_bytes:] == whole[header_bytes:]


@pytest.mark.parametrize("fmt", ["wav", "opus"])
def test_streamed_encoding_decodes_like_whole(fmt):
    streamed = _streamed(fmt)
    whole, rate = decode_audio(encode_audio(TONE, 24000, fmt))
    again, _ = decode_audio(streamed)
    assert rate == 24000
    assert abs(len(again) - len(whole)) <= 0.05 * len(whole)
    n = min(len(again), len(whole))
    assert np.corrcoef(again[:n], whole[:n])[0, 1] > 0.9


def test_opus_resamples_to_a_rate_it_supports():
    audio, rate = decode_audio(encode_audio(TONE, 22050, "opus"))
    assert rate == 48000 and abs(len(audio) / rate - len(TONE) / 22050) < 0.05


def test_aac_and_garbage_are_clear_errors():
    with pytest.raises(InvalidInput, match="aac"):
        encode_audio(TONE, 24000, "aac")
    with pytest.raises(InvalidInput, match="could not decode") as garbage:
        decode_audio(b"\x00\x01" * 100)
    assert "BytesIO" not in str(garbage.value) and " at 0x" not in str(garbage.value)  # no object reprs


def silent_flac(seconds: int, rate: int = 8000) -> bytes:
    """FLAC of silence: a few KB a minute."""
    out = io.BytesIO()
    with sf.SoundFile(out, "w", rate, 1, format="FLAC", subtype="PCM_16") as f:
        for _ in range(seconds // 60):
            f.write(np.zeros(60 * rate, np.int16))
    return out.getvalue()


def test_compressed_audio_past_the_limit_is_refused_without_decoding_it_all():
    bomb = silent_flac(3600)  # an hour: 115 MB as float32, 0.1 MB as FLAC
    assert len(bomb) < 200_000
    tracemalloc.start()  # numpy reports its buffers to tracemalloc
    try:
        with pytest.raises(InputTooLarge, match="file is 3600.0 s long; this server accepts at most 60 s"):
            decode_audio(bomb, max_seconds=60)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 10 * 1024 * 1024  # a minute and a block (2 MB of float32), not the hour
    audio, rate = decode_audio(silent_flac(60), max_seconds=60)  # at the limit: accepted
    assert len(audio) == 60 * rate


def test_subtitles():
    segments = [{"start": 0.0, "end": 1.5, "text": " one"}, {"start": 61.25, "end": 3723.0, "text": "two"}]
    assert (
        to_srt(segments) == "1\n00:00:00,000 --> 00:00:01,500\none\n\n2\n00:01:01,250 --> 01:02:03,000\ntwo\n"
    )
    assert to_vtt(segments).startswith("WEBVTT\n\n00:00:00.000 --> 00:00:01.500\none\n")


def test_voice_store_persists_atomically(tmp_path):
    store = VoiceStore(tmp_path)
    voice = store.save("narrator", TONE, 24000, "a tone")
    with pytest.raises(VoiceStoreError):
        store.save("narrator", TONE, 24000, "again")
    with pytest.raises(VoiceStoreError):
        store.save("../escape", TONE, 24000, "x")
    (tmp_path / f"voice_{'0' * 16}.wav").write_bytes(b"half written")  # no metadata: not a voice
    reopened = VoiceStore(tmp_path)
    assert [v.id for v in reopened.list()] == [voice.id]
    assert not (tmp_path / f"voice_{'0' * 16}.wav").exists()  # removed on opening: no record names it
    audio, rate = reopened.load_audio(reopened.find("narrator"))
    assert rate == 24000 and np.abs(audio - TONE).max() < 1e-3
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    assert reopened.delete(voice.id) and not reopened.delete(voice.id) and reopened.list() == []


def test_admission_queues_then_refuses_with_retry_after():
    async def scenario():
        admission = Admission(max_running=1, max_queued=1)
        await admission.acquire()
        waiter = asyncio.ensure_future(admission.acquire())
        await asyncio.sleep(0.01)
        assert admission.queued == 1 and not waiter.done()
        with pytest.raises(APIError) as refused:
            await admission.acquire()
        assert refused.value.status == 429 and int(refused.value.headers["Retry-After"]) >= 1
        await admission.release(0.5)
        await asyncio.wait_for(waiter, 1)
        assert admission.running == 1 and admission.queued == 0
        await admission.start_draining()
        with pytest.raises(APIError) as draining:
            await admission.acquire()
        assert draining.value.status == 503

    asyncio.run(scenario())


def test_wav_header_of_a_stream_has_unknown_length():
    encoder = StreamEncoder("wav", 16000)
    data = encoder.feed(TONE[:1600]) + encoder.close()
    info = sf.info(io.BytesIO(data))
    assert info.samplerate == 16000 and info.channels == 1
