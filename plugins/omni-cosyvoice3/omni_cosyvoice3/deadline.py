"""Deadline order for the flow and HiFT (``--option schedule=deadline``): the streams whose
listeners run dry soonest are served first.

Each stream has a playback clock at each stage: the audio the stage has produced for it so far,
played from the moment its first piece was produced (``omni_core.playback.PlaybackBuffer``). Its
slack is the audio left on that clock; a request that has produced nothing yet has waited since
the stage first saw it, and its slack is minus that wait. The batch executor hands the worker each
request's oldest queued message (``choose``); the worker takes what costs nothing (conditioning,
tokens that complete no chunk) and then the due work by slack, adding a stream only while the call
stays within a captured CUDA graph bucket (on a GPU; the first always runs): a stream far ahead
of its listener waits a call rather than make an urgent one wait for a long eager call.
Arrival order (the default) takes every request's oldest message as it came.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from omni_core.playback import PlaybackBuffer

from .stage_workers import FlowWorker, HiftWorker, stretched_frames

SCHEDULES = ("deadline", "arrival")  # the default first


class StreamClocks:
    """Per request: when the stage first saw it, and the playback clock of what it produced."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.first_seen: dict[str, float] = {}
        self.buffers: dict[str, PlaybackBuffer] = {}

    def seen(self, request_id: str, now: float) -> None:
        self.first_seen.setdefault(request_id, now)

    def produced(self, request_id: str, seconds: float) -> None:
        self.buffers.setdefault(request_id, PlaybackBuffer()).add(self.clock(), seconds)

    def slack(self, request_id: str, now: float) -> float:
        buffer = self.buffers.get(request_id)
        margin = buffer.margin(now) if buffer is not None else None
        if margin is None:
            return self.first_seen.get(request_id, now) - now
        return margin

    def forget(self, request_id: str) -> None:
        self.first_seen.pop(request_id, None)
        self.buffers.pop(request_id, None)


def by_deadline(clocks: StreamClocks, heads, frames_of, fits) -> list:
    """``heads``' messages in the order to run them now: those without work (``frames_of`` None)
    first, then due ones by slack while ``fits(batch, longest frames)``."""
    now = clocks.clock()
    free, due = [], []
    for message in heads:
        frames = frames_of(message)
        (free if frames is None else due).append((message, frames))
    due.sort(key=lambda item: clocks.slack(item[0].request_id, now))
    chosen, longest = [], 0
    for message, frames in due:
        if chosen and not fits(len(chosen) + 1, max(longest, frames)):
            continue
        chosen.append(message)
        longest = max(longest, frames)
    # work that costs nothing goes first: a new request's conditioning must not be cut by max_batch
    return [message for message, _ in free] + chosen


def _graph_fit(model) -> Callable[[int, int], bool]:
    graphs = model.graphs
    if graphs is None:  # no graphs (CPU, or turned off): no size budget, order only
        return lambda batch, frames: True
    return lambda batch, frames: graphs.bucket(batch, frames) is not None


class _ByDeadline:
    """What both workers add: the clocks (first seen as a message is processed, fed as audio
    leaves), ``choose`` by slack, and their release. The worker class supplies
    ``_audio_seconds(payload)`` and ``_frames_after(message)``."""

    def __init__(self, *args, clock: Callable[[], float] = time.monotonic, **kwargs):
        super().__init__(*args, **kwargs)
        self.clocks = StreamClocks(clock)

    def process(self, messages, emit) -> None:
        now = self.clocks.clock()
        for message in messages:
            self.clocks.seen(message.request_id, now)

        def timed(request_id, port, payload=None, end=True):
            payload = {} if payload is None else payload
            seconds = self._audio_seconds(payload)
            if seconds:
                self.clocks.produced(request_id, seconds)
            emit(request_id, port, payload, end)

        super().process(messages, timed)

    def choose(self, heads) -> list:
        return by_deadline(self.clocks, heads, self._frames_after, _graph_fit(self.model))

    def release(self, request_id: str) -> None:
        super().release(request_id)
        self.clocks.forget(request_id)


class DeadlineFlowWorker(_ByDeadline, FlowWorker):
    """The flow worker, serving due chunks by slack; ``mel_seconds``: audio seconds a mel frame."""

    def __init__(self, *args, mel_seconds: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.mel_seconds = mel_seconds

    def _audio_seconds(self, payload) -> float:
        mel = payload.get("mel")
        return 0.0 if mel is None else mel.shape[-1] * self.mel_seconds / payload.get("speed", 1.0)

    def _frames_after(self, message) -> int | None:
        """Query frames of the flow call this message makes due (prompt included, less the
        frames the flow cache holds for it where the call runs on the cache), or None."""
        stream = self.streams.get(message.request_id)
        if stream is None or message.port != "tokens":
            return None
        tokens = len(stream.tokens) + len(message.payload.get("token_ids", []))
        due = stream.due_end(tokens, stream.finished or message.end)
        if due is None:
            return None
        # a non-final call holds its lookahead tokens back: its frames end at ``end`` either way
        frames = (len(stream.prompt_tokens) + due[0]) * self.model.cfg.token_mel_ratio
        on_cache = self.cache is not None and stream.streaming and (self.masked_last or not due[1])
        return frames - (self.cache.cached_frames(message.request_id) if on_cache else 0)


class DeadlineHiftWorker(_ByDeadline, HiftWorker):
    """The HiFT worker, vocoding by slack; ``sample_rate`` of its audio."""

    def __init__(self, *args, sample_rate: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.sample_rate = sample_rate

    def _audio_seconds(self, payload) -> float:
        audio = payload.get("audio")
        return 0.0 if audio is None else audio.numel() / self.sample_rate

    def _frames_after(self, message) -> int | None:
        mel = message.payload.get("mel")
        new = int(mel.shape[-1]) if mel is not None else 0
        if new == 0 and not message.end:
            return None
        new = stretched_frames(new, float(message.payload.get("speed", 1.0)))  # as the worker will
        stream = self.streams.get(message.request_id)
        return (0 if stream is None else int(stream.mel.shape[1])) + new
