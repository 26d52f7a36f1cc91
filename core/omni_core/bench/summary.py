"""Turning request records into the numbers of one concurrency level."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import jiwer
import numpy as np

from omni_core.bench.records import RequestRecord
from omni_core.playback import PlaybackBuffer

PERCENTILES = (50, 95, 99)


def percentiles(values: Sequence[float], points: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """``{"p50": .., "p95": .., "p99": ..}`` with linear interpolation; ``None`` for no values."""
    if not values:
        return {f"p{p}": None for p in points}
    computed = np.percentile(np.asarray(values, dtype=np.float64), list(points))
    return {f"p{p}": float(v) for p, v in zip(points, computed, strict=True)}


# Case and punctuation differ between transcribers without being errors.
_WER_WORDS = jiwer.Compose([
    jiwer.ToLowerCase(), jiwer.RemovePunctuation(), jiwer.RemoveMultipleSpaces(), jiwer.Strip(),
    jiwer.ReduceToListOfListOfWords(),
])


def word_error_rate(references: Sequence[str], hypotheses: Sequence[str]) -> float | None:
    """Corpus WER (all errors over all reference words) after lowercasing and dropping punctuation."""
    pairs = [(ref, hyp) for ref, hyp in zip(references, hypotheses, strict=True) if _WER_WORDS(ref)[0]]
    if not pairs:
        return None
    refs, hyps = zip(*pairs, strict=True)
    return float(jiwer.wer(list(refs), list(hyps), reference_transform=_WER_WORDS, hypothesis_transform=_WER_WORDS))


@dataclass
class LevelSummary:
    concurrency: int
    request_rate: float | None  # requests/s of the open loop; None for a closed loop
    num_requests: int
    completed: int
    failed: int
    errors: dict[str, int]
    duration_s: float
    request_throughput: float  # completed requests per wall second
    output_audio_seconds: float
    input_audio_seconds: float
    audio_seconds_per_second: float  # audio produced (or transcribed) per wall second
    output_tokens_per_second: float  # completion tokens per wall second (chat, from usage)
    time_to_first_output_ms: dict[str, float | None] = field(default_factory=dict)
    latency_ms: dict[str, float | None] = field(default_factory=dict)
    rtf: dict[str, float | None] = field(default_factory=dict)  # per-request latency / audio seconds
    underrun_s: dict[str, float | None] = field(default_factory=dict)
    requests_with_underrun: int = 0
    # each streamed request's least audio left in the listener's buffer when later audio arrived
    # (seconds; negative: a stall): how close to a gap the stream came
    min_buffer_s: dict[str, float | None] = field(default_factory=dict)
    wer: float | None = None  # transcriptions whose dataset row gives the spoken text

    def to_json(self) -> dict:
        return asdict(self)


def summarize(
    records: Sequence[RequestRecord], *, concurrency: int, request_rate: float | None, duration_s: float
) -> LevelSummary:
    ok = [r for r in records if r.ok]
    errors = Counter(r.error_key for r in records if not r.ok)
    output_audio = sum(r.output_audio_seconds for r in ok)
    input_audio = sum(r.input_audio_seconds for r in ok)
    # A speech or audio-chat benchmark measures audio made; a transcription one audio consumed.
    measured_audio = output_audio if output_audio > 0 else input_audio
    rtfs = []
    for r in ok:
        seconds = r.output_audio_seconds or r.input_audio_seconds
        if seconds > 0:
            rtfs.append(r.latency / seconds)
    streamed = [r for r in ok if r.chunks]
    played = [PlaybackBuffer.of(r.chunks) for r in streamed]
    underruns = [buffer.stalled for buffer in played]
    underrun = percentiles(underruns)
    underrun["total"] = float(sum(underruns)) if underruns else None
    lowest = [buffer.lowest for buffer in played if buffer.lowest is not None]
    wall = max(duration_s, 1e-9)
    scored = [r for r in ok if r.reference_text]
    return LevelSummary(
        concurrency=concurrency,
        request_rate=request_rate,
        num_requests=len(records),
        completed=len(ok),
        failed=len(records) - len(ok),
        errors=dict(sorted(errors.items())),
        duration_s=duration_s,
        request_throughput=len(ok) / wall,
        output_audio_seconds=output_audio,
        input_audio_seconds=input_audio,
        audio_seconds_per_second=measured_audio / wall,
        output_tokens_per_second=sum(r.output_tokens for r in ok) / wall,
        time_to_first_output_ms=_ms(percentiles([r.time_to_first_output for r in ok if r.first_output is not None])),
        latency_ms=_ms(percentiles([r.latency for r in ok])),
        rtf={"mean": float(np.mean(rtfs)) if rtfs else None, **percentiles(rtfs)},
        underrun_s=underrun,
        requests_with_underrun=sum(1 for u in underruns if u > 0),
        min_buffer_s=percentiles(lowest, (1, 5, 50)),
        wer=word_error_rate([r.reference_text for r in scored], [r.output_text for r in scored]),
    )


def _ms(seconds: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else v * 1000.0 for k, v in seconds.items()}
