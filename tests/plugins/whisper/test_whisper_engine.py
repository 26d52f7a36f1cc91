"""The Whisper pipeline in this process (``Omni``, the bundled tiny.en): batching does not change
results, long audio decodes in 30 s windows, aborts and bad input free everything."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from omni_core.api import Omni
from omni_core.pipeline import RequestFailed


@pytest.fixture(scope="module")
def omni():
    with Omni(family="whisper", device="cpu", options={"dtype": "float32"}) as instance:
        yield instance


def _decoder_idle(omni) -> bool:
    stats = omni.stats()["stages"]["decoder"]
    return stats["rows"] == 0 and stats["waiting_windows"] == 0 and stats["running"] == 0


def test_concurrent_requests_batch_and_match_one_by_one(omni, spoken_16k):
    clips = spoken_16k[3:7]
    stamps = [False, True, False, True]  # rows with and without timestamp rules share the batch

    def run(index: int) -> tuple[str, list]:
        result = omni.transcribe(clips[index], 16000, timestamps=stamps[index])
        return result.text, [(s["start"], s["end"]) for s in result.segments]

    alone = [run(i) for i in range(len(clips))]
    steps_before = omni.stats()["stages"]["decoder"]["steps"]
    with ThreadPoolExecutor(len(clips)) as pool:
        together = list(pool.map(run, range(len(clips))))
    assert together == alone
    assert "park" in together[2][0]
    assert len(alone[1][1]) >= 1 and alone[1][1][0][1] < 10.0  # timestamped segment ends inside the clip
    steps = omni.stats()["stages"]["decoder"]["steps"] - steps_before
    # decoded one by one, the four would need about as many steps as their tokens together
    assert steps < sum(len(text.split()) for text, _ in alone)
    assert _decoder_idle(omni)


def test_long_audio_is_decoded_in_windows_with_timestamps(omni, spoken_16k):
    silence = np.zeros(16000 * 4, dtype=np.float32)
    parts = [spoken_16k[0], silence] * 6 + [spoken_16k[9]]  # about 45 s: two windows
    audio = np.concatenate(parts)
    result = omni.transcribe(audio, 16000, timestamps=True)
    assert result.duration == pytest.approx(len(audio) / 16000)
    assert "invitation" in result.text.lower() and "weather" in result.text.lower()
    starts = [segment["start"] for segment in result.segments]
    assert starts == sorted(starts) and starts[0] < 2.0
    assert max(segment["end"] for segment in result.segments) > 30.0
    assert all(0 <= s["start"] <= s["end"] <= result.duration + 1e-6 for s in result.segments)


def test_timestamped_long_audio_loses_nothing_at_the_window_cuts(omni, spoken_16k):
    """Sentences with short pauses over three windows: cut at fixed 30 s marks, Whisper left the
    speech after each window's last whole segment untranscribed (that run's word error rate with
    timestamps 0.18 against 0.06 without, over 124 s); cut in pauses, both read the same."""
    pause = np.zeros(4000, np.float32)
    audio = np.concatenate([part for clip in spoken_16k * 2 for part in (clip, pause)])
    assert len(audio) > 16000 * 61
    stamped = omni.transcribe(audio, 16000, timestamps=True)
    plain = omni.transcribe(audio, 16000)
    words = lambda text: re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()  # noqa: E731
    assert words(stamped.text) == words(plain.text)
    assert max(s["end"] for s in stamped.segments) > 60


def test_streamed_deltas_add_up_to_the_final_text(omni, spoken_16k):
    handle = omni.submit(omni.transcription_inputs(spoken_16k[10], 16000))
    deltas, final = [], None
    for event in handle:
        if event.end:
            final = event.payload
        else:
            deltas.append(event.payload["text"])
    assert len(deltas) >= 3  # tokens stream as they decode
    assert "".join(deltas) == final["text"] and "football" in final["text"]


def test_a_window_without_speech_is_dropped_and_never_streamed(omni, spoken_16k):
    """Whisper's rule: no-speech token likely (> 0.6) and text unlikely (mean log-probability
    <= -1): sampled at temperature 1, silence decodes to unlikely text, which is dropped; a
    likely hallucination (tiny.en's "you" at temperature 0) is kept, as Whisper keeps it, with
    its no_speech_prob for the caller to judge."""
    silence = np.zeros(16000 * 5, np.float32)
    dropped = omni.stats()["stages"]["decoder"]["silent_windows"]
    events = list(omni.submit(omni.transcription_inputs(silence, 16000, temperature=1.0, timestamps=True)))
    assert [e.payload["text"] for e in events] == [""] and events[-1].end  # no delta streamed
    assert events[-1].payload["segments"] == []
    assert omni.stats()["stages"]["decoder"]["silent_windows"] == dropped + 1
    kept = omni.transcribe(silence, 16000, timestamps=True)
    assert kept.text.strip().lower() == "you" and kept.segments[0]["no_speech_prob"] > 0.6
    assert kept.segments[0]["avg_logprob"] > -1.0 and kept.segments[0]["temperature"] == 0.0
    speech = omni.transcribe(spoken_16k[2], 16000, timestamps=True)
    assert "coffee" in speech.text and all(s["no_speech_prob"] < 0.1 for s in speech.segments)


def test_abort_frees_rows_and_the_engine_goes_on(omni, spoken_16k):
    audio = np.concatenate([spoken_16k[1], np.zeros(16000, dtype=np.float32)] * 20)  # 3 windows
    handle = omni.submit(omni.transcription_inputs(audio, 16000))
    for event in handle:
        if not event.end:
            break  # the first delta: windows are decoding
    handle.abort()
    deadline = time.monotonic() + 10
    while not _decoder_idle(omni):
        assert time.monotonic() < deadline, omni.stats()["stages"]["decoder"]
        time.sleep(0.05)
    assert "Friday" in omni.transcribe(spoken_16k[1], 16000).text


def test_prompt_conditions_the_first_window(omni, spoken_16k):
    result = omni.transcribe(spoken_16k[2], 16000, prompt="Coffee orders <|endoftext|> for the office.")
    assert "coffee" in result.text.lower() and "endoftext" not in result.text


@pytest.mark.parametrize(
    "audio, kwargs, message",
    [
        (np.full(16000, np.nan, dtype=np.float32), {}, "NaN"),
        (np.zeros(16000, dtype=np.float32), {"language": "fr"}, "English-only"),
    ],
)
def test_bad_input_fails_only_that_request(omni, spoken_16k, audio, kwargs, message):
    with pytest.raises(RequestFailed, match=message):
        omni.transcribe(audio, 16000, **kwargs)
    assert "coffee" in omni.transcribe(spoken_16k[2], 16000).text
    assert _decoder_idle(omni)


def test_temperature_fallback_retries_unlikely_windows_only(spoken_16k):
    # speech played backwards: speech-like (not silent, see Window.silent) and unlikely as text
    backwards = spoken_16k[2][::-1].copy()
    with Omni(family="whisper", device="cpu", options={"temperature_fallback": True}) as omni:
        events = list(omni.submit(omni.transcription_inputs(backwards, 16000)))
        # decoded again at 0.2, 0.4 ... up to 1.0 (at most 5 retries)
        retries = omni.stats()["stages"]["decoder"]["fallbacks"]
        assert 1 <= retries <= 5
        assert "".join(e.payload["text"] for e in events if not e.end) == events[-1].payload["text"]
        result = omni.transcribe(spoken_16k[2], 16000)  # clear speech passes at temperature 0
        assert "coffee" in result.text and omni.stats()["stages"]["decoder"]["fallbacks"] == retries
