import pytest
from omni_core.bench.records import RequestRecord
from omni_core.bench.summary import percentiles, summarize, word_error_rate
from omni_core.playback import PlaybackBuffer, playback_underrun


def test_percentiles_interpolate_linearly():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentiles(values) == {"p50": 50.5, "p95": pytest.approx(95.05), "p99": pytest.approx(99.01)}
    assert percentiles([]) == {"p50": None, "p95": None, "p99": None}
    assert percentiles([7.0]) == {"p50": 7.0, "p95": 7.0, "p99": 7.0}


def test_player_that_keeps_up_never_waits():
    # 1 s chunks arriving every 0.5 s: the buffer only grows.
    assert playback_underrun([(10.0, 1.0), (10.5, 1.0), (11.0, 1.0)]) == 0.0
    assert playback_underrun([]) == 0.0


def test_player_waits_for_late_chunks_only_after_playback_starts():
    # First audio at t=5 (the wait before it is time to first audio, not underrun). 0.5 s of
    # audio plays until 5.5; the next chunk lands at 6.0 (0.5 s stall) and plays until 6.25;
    # the third lands at 6.2, in time, and extends playback to 7.25; the last at 8.0 (0.75 s).
    chunks = [(5.0, 0.5), (6.0, 0.25), (6.2, 1.0), (8.0, 0.1)]
    assert playback_underrun(chunks) == pytest.approx(0.5 + 0.75)


def test_buffer_margin_counts_down_and_records_the_lowest_point():
    buffer = PlaybackBuffer()
    assert buffer.margin(0.0) is None
    buffer.add(1.0, 0.5)  # plays 1.0 .. 1.5
    assert buffer.margin(1.2) == pytest.approx(0.3)
    buffer.add(1.3, 2.0)  # 0.2 s left when it came: plays until 3.5
    buffer.add(4.0, 1.0)  # 0.5 s late: stalls, then plays 4.0 .. 5.0
    assert (buffer.lowest, buffer.stalled, buffer.seconds) == (pytest.approx(-0.5), pytest.approx(0.5), 3.5)
    assert buffer.margin(4.5) == pytest.approx(0.5)
    # audio an encoder held back plays from when it is sent, all of it
    buffer.hold(0.25)
    buffer.hold(0.25)
    buffer.send(4.6)
    assert (buffer.seconds, buffer.held, buffer.margin(4.6)) == (4.0, 0.0, pytest.approx(0.9))


def _ok(start, first, end, chunks=(), input_seconds=0.0):
    record = RequestRecord(start=start, status=200, end=end, input_audio_seconds=input_seconds)
    if chunks:
        record.first_audio = first
    else:
        record.first_text = first
    record.chunks = list(chunks)
    return record


def test_summary_counts_rates_and_errors():
    records = [
        _ok(0.0, 0.1, 1.0, [(0.1, 1.0), (0.5, 1.0)]),  # 2 s of audio in 1 s
        _ok(0.0, 0.3, 2.0, [(0.3, 0.5), (2.0, 1.5)]),  # stalls 1.2 s: plays until 0.8, next at 2.0
        RequestRecord(start=0.0, end=0.2, status=429, error="http"),
        RequestRecord(start=0.0, end=0.2, status=429, error="http"),
        RequestRecord(start=0.0, end=5.0, error="timeout"),
    ]
    summary = summarize(records, concurrency=4, request_rate=None, duration_s=4.0)
    assert (summary.num_requests, summary.completed, summary.failed) == (5, 2, 3)
    assert summary.errors == {"429": 2, "timeout": 1}
    assert summary.output_audio_seconds == pytest.approx(4.0)
    assert summary.audio_seconds_per_second == pytest.approx(1.0)
    assert summary.request_throughput == pytest.approx(0.5)
    assert summary.time_to_first_output_ms["p50"] == pytest.approx(200.0)
    assert summary.latency_ms["p50"] == pytest.approx(1500.0)
    assert summary.rtf["mean"] == pytest.approx((1.0 / 2.0 + 2.0 / 2.0) / 2)
    assert summary.underrun_s["total"] == pytest.approx(1.2)
    assert summary.requests_with_underrun == 1
    # least buffer: 0.6 s left when the first stream's second chunk came; -1.2 s for the second
    assert summary.min_buffer_s["p1"] == pytest.approx(-1.2 + 0.01 * 1.8)
    assert summary.min_buffer_s["p50"] == pytest.approx((0.6 - 1.2) / 2)


def test_transcription_summary_uses_input_audio():
    records = [_ok(0.0, 0.2, 0.5, input_seconds=2.0), _ok(1.0, 1.1, 2.0, input_seconds=4.0)]
    summary = summarize(records, concurrency=1, request_rate=None, duration_s=2.0)
    assert summary.audio_seconds_per_second == pytest.approx(3.0)
    assert summary.rtf["p50"] == pytest.approx((0.25 + 0.25) / 2)
    assert summary.underrun_s["total"] is None  # nothing was played back


def test_word_error_rate_ignores_case_and_punctuation():
    # 6 reference words; "cat" -> "bat" is a substitution and "on" an insertion.
    assert word_error_rate(["Hello there, friend.", "The cat sat."], ["hello there friend", "the bat sat on"]) == (
        pytest.approx(2 / 6)
    )
    assert word_error_rate(["Hello there."], [""]) == 1.0
    assert word_error_rate(["..."], ["anything"]) is None  # no reference words to score


def test_transcription_summary_scores_rows_with_a_reference():
    heard = _ok(0.0, 0.1, 0.5, input_seconds=1.0)
    heard.reference_text, heard.output_text = "Good morning.", "good morning"
    misheard = _ok(0.0, 0.1, 0.5, input_seconds=1.0)
    misheard.reference_text, misheard.output_text = "See you soon.", "sea you"
    unscored = _ok(0.0, 0.1, 0.5, input_seconds=1.0)
    unscored.output_text = "no reference"
    summary = summarize([heard, misheard, unscored], concurrency=1, request_rate=None, duration_s=1.0)
    assert summary.wer == pytest.approx(2 / 5)
