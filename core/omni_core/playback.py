"""A real-time listener's audio buffer: how far a stream is ahead of the one who hears it.

Playback starts when the first audio arrives and consumes one second of audio a second; when the
buffer runs dry before the next audio arrives, the player stalls until it does (an underrun). The
same model serves the benchmark (the client's arrivals), the server's metrics (what it sent) and
the stages that schedule by deadline (what they produced): how many seconds a stream has left
before its listener hears a gap.
"""

from __future__ import annotations

from collections.abc import Sequence


class PlaybackBuffer:
    """Audio seconds added at wall-clock times (seconds, any monotonic clock)."""

    def __init__(self) -> None:
        self.play_until: float | None = None  # when the buffered audio runs out
        self.stalled = 0.0  # seconds the player waited once playback had started
        self.lowest: float | None = None  # least audio left when later audio arrived (< 0: a stall)
        self.seconds = 0.0
        self.held = 0.0  # audio produced but not sent yet (an encoder holding a page back)

    @classmethod
    def of(cls, chunks: Sequence[tuple[float, float]]) -> PlaybackBuffer:
        """The buffer after ``(arrival, seconds)`` chunks in arrival order."""
        buffer = cls()
        for arrival, seconds in chunks:
            buffer.add(arrival, seconds)
        return buffer

    def hold(self, seconds: float) -> None:
        """Audio made but not sent yet: it reaches the listener with the next ``send``."""
        self.held += seconds

    def send(self, arrival: float) -> None:
        """What was held reaches the listener at ``arrival``."""
        self.add(arrival, self.held)
        self.held = 0.0

    def add(self, arrival: float, seconds: float) -> None:
        if seconds <= 0:
            return
        self.seconds += seconds
        if self.play_until is None:
            self.play_until = arrival + seconds
            return
        left = self.play_until - arrival
        self.lowest = left if self.lowest is None else min(self.lowest, left)
        if left < 0:
            self.stalled -= left
            self.play_until = arrival
        self.play_until += seconds

    def margin(self, now: float) -> float | None:
        """Seconds of audio the listener has left at ``now`` (negative: stalled that long), or
        None before any audio."""
        return None if self.play_until is None else self.play_until - now


def playback_underrun(chunks: Sequence[tuple[float, float]]) -> float:
    """Seconds a real-time player would have waited for audio once playback started, for
    ``(arrival, seconds)`` chunks in arrival order."""
    return PlaybackBuffer.of(chunks).stalled
