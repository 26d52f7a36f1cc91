"""What one benchmark request observed, in the client's clock (``time.perf_counter`` seconds)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestRecord:
    """One request as the client saw it.

    ``chunks`` lists ``(arrival_time, audio_seconds)`` for every piece of audio received, in
    order; the simulated player replays them.
    """

    start: float
    end: float | None = None
    status: int | None = None  # HTTP status; None when no response came back at all
    error: str | None = None  # a category: "http", "timeout", "connect", "protocol", "stream_error"
    detail: str | None = None  # the server's message or the exception, for the log
    first_audio: float | None = None
    first_text: float | None = None
    chunks: list[tuple[float, float]] = field(default_factory=list)
    input_audio_seconds: float = 0.0  # audio sent (transcriptions, audio chat)
    output_text: str = ""
    output_tokens: int = 0  # completion tokens, where the server reports usage
    reference_text: str | None = None  # what the sent audio says, where the dataset knows it

    @property
    def ok(self) -> bool:
        return self.error is None and self.status is not None and 200 <= self.status < 300

    @property
    def output_audio_seconds(self) -> float:
        return sum(seconds for _, seconds in self.chunks)

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.start

    @property
    def first_output(self) -> float | None:
        """The first audio where the reply speaks (speech, audio chat), else the first text."""
        return self.first_audio if self.first_audio is not None else self.first_text

    @property
    def time_to_first_output(self) -> float | None:
        first = self.first_output
        return None if first is None else first - self.start

    def add_audio(self, arrival: float, seconds: float) -> None:
        if seconds <= 0:
            return
        if self.first_audio is None:
            self.first_audio = arrival
        self.chunks.append((arrival, seconds))

    def add_text(self, arrival: float, text: str) -> None:
        if not text:
            return
        if self.first_text is None:
            self.first_text = arrival
        self.output_text += text

    def fail(self, category: str, detail: str, at: float) -> None:
        self.error, self.detail, self.end = category, detail[:500], at

    @property
    def error_key(self) -> str:
        """How the error tables group this request: the HTTP status, else the failure category."""
        if self.status is not None and not 200 <= self.status < 300:
            return str(self.status)
        return self.error or "ok"
