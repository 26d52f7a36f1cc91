"""What a caller holds for one request: its output events, in order, from any thread or event loop."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any


@dataclass
class OutputEvent:
    """One chunk of a terminal output (``name`` as in ``Topology.outputs``); the last has ``end=True``."""

    name: str
    payload: dict[str, Any] = field(default_factory=dict)
    end: bool = True
    seq: int = 0


class RequestFailed(RuntimeError):
    """A stage failed the request; ``stage`` names it (empty when the runtime itself failed it)."""

    def __init__(self, stage: str, message: str):
        self.stage = stage
        self.message = message
        where = f"stage {stage!r} failed" if stage else "request failed"
        super().__init__(f"{where}: {message}")


class DeadlineExceeded(RequestFailed):
    """The request ran past the deadline given to ``submit``; it was stopped in every stage."""

    def __init__(self):
        super().__init__("", "it ran past its deadline and was stopped in every stage")


class StageUnavailable(RequestFailed):
    """A stage the request needed is being restarted (its process died): the failure is
    transient, and the stage is expected back in about ``retry_after`` seconds."""

    def __init__(self, stage: str, message: str, retry_after: float):
        super().__init__(stage, message)
        self.retry_after = retry_after


class ClusterLost(RequestFailed):
    """The cluster the pipeline's stages were placed on is lost (its head node gone): no request
    can run until the pipeline is started again on a cluster that is there."""

    def __init__(self, message: str):
        super().__init__("", message)


class EventSource:
    """Blocking iteration and ``collect`` over a ``get(timeout)`` that returns the next event,
    ``None`` at the end."""

    def get(self, timeout: float | None = None) -> OutputEvent | None:
        raise NotImplementedError

    def __iter__(self):
        while True:
            event = self.get()
            if event is None:
                return
            yield event

    def collect(self, timeout: float | None = None) -> dict[str, list[OutputEvent]]:
        """Every event, grouped by output name (blocking; for tests and simple callers)."""
        grouped: dict[str, list[OutputEvent]] = {}
        while True:
            event = self.get(timeout=timeout)
            if event is None:
                return grouped
            grouped.setdefault(event.name, []).append(event)


class RequestHandle(EventSource):
    """Iterate it (``for`` or ``async for``) to receive the request's ``OutputEvent``s.

    Iteration ends when every terminal output the request was expected to produce has ended, or
    right away after ``abort()``; it raises ``RequestFailed`` when a stage failed the request.
    """

    def __init__(self, request_id: str, pipeline: Any, expected: tuple[str, ...] = ()):
        self.request_id = request_id
        self.expected_outputs = expected
        self._pipeline = pipeline
        self._events: deque[OutputEvent] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._error: RequestFailed | None = None
        self.aborted = False
        self._wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []

    # -- runtime side (any thread) ----------------------------------------------------------------

    def _push(self, event: OutputEvent) -> None:
        with self._cond:
            if self._closed:
                return
            self._events.append(event)
            self._cond.notify_all()
        self._wake()

    def _close(self, error: RequestFailed | None = None, aborted: bool = False) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._error = error
            self.aborted = aborted
            if aborted:
                self._events.clear()
            self._cond.notify_all()
        self._wake()

    def _wake(self) -> None:
        for loop, event in list(self._wakers):
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # that loop is closed; its iterator is gone
                pass

    # -- caller side ------------------------------------------------------------------------------

    @property
    def done(self) -> bool:
        with self._cond:
            return self._closed and not self._events

    @property
    def error(self) -> RequestFailed | None:
        """What the request failed with (raised at the end of iteration); None otherwise."""
        with self._cond:
            return self._error

    def abort(self) -> None:
        self._pipeline.abort(self.request_id)

    def _next_ready(self) -> tuple[bool, OutputEvent | None]:
        """With the lock held: (finished, event or None when nothing is ready yet)."""
        if self._events:
            return False, self._events.popleft()
        if self._closed:
            if self._error is not None:
                raise self._error
            return True, None
        return False, None

    def get(self, timeout: float | None = None) -> OutputEvent | None:
        """The next event, ``None`` once the request is over; ``TimeoutError`` after ``timeout``."""
        with self._cond:
            while True:
                finished, event = self._next_ready()
                if finished or event is not None:
                    return event
                if not self._cond.wait(timeout=timeout):
                    raise TimeoutError(f"request {self.request_id!r}: no output within {timeout} s")

    async def __aiter__(self):
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        entry = (loop, wake)
        self._wakers.append(entry)
        try:
            while True:
                wake.clear()
                with self._cond:
                    finished, event = self._next_ready()
                if finished:
                    return
                if event is None:
                    await wake.wait()
                    continue
                yield event
        finally:
            self._wakers.remove(entry)
