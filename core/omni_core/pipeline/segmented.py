"""One request served as several pipeline requests in turn (a long text spoken in segments):
their events in order, as if one request had produced them."""

from __future__ import annotations

import threading
import uuid
from typing import Any

from omni_core.pipeline.handle import EventSource, OutputEvent, RequestFailed, RequestHandle


class SegmentedHandle(EventSource):
    """Runs ``parts`` (entry payloads) as pipeline requests ``<request_id>.<i>`` and yields their
    events part after part, like a ``RequestHandle`` (``get``, ``for``, ``async for``, ``abort``,
    ``done``, ``aborted``).

    While one part is read, ``ahead`` more already run, so the next part's first output is ready
    when the one before ends, and no more than ``1 + ahead`` parts hold the pipeline at once.
    Only the last part's last event of an output has ``end=True``, and usage (``usage`` in a
    payload) is summed over the parts and given once, with that event. A part that fails aborts
    the others and its ``RequestFailed`` is raised; ``abort()`` stops every part. ``deadline``
    (``time.monotonic()``) is the whole request's: every part is submitted with it.
    """

    def __init__(
        self,
        pipeline: Any,
        parts: list[dict[str, Any]],
        request_id: str | None = None,
        ahead: int = 1,
        deadline: float | None = None,
    ):
        if not parts:
            raise ValueError("a segmented request needs at least one part")
        self.request_id = request_id or uuid.uuid4().hex
        self._pipeline = pipeline
        self._parts = list(parts)
        self._ahead = max(0, ahead)
        self._deadline = deadline
        self._lock = threading.Lock()
        self._handles: list[RequestHandle] = []
        self._current = 0  # the part being read (only the reader moves it)
        self._aborted = False
        self._usage: dict[str, Any] = {}
        self._seq: dict[str, int] = {}
        self._submit_due()
        self.expected_outputs = self._handles[0].expected_outputs

    # -- parts ------------------------------------------------------------------------------------

    def _submit_due(self) -> None:
        """Submits the parts that may run now (the one being read and ``ahead`` after it)."""
        with self._lock:
            due = min(len(self._parts), self._current + 1 + self._ahead)
            try:
                while not self._aborted and len(self._handles) < due:
                    i = len(self._handles)
                    self._handles.append(
                        self._pipeline.submit(self._parts[i], request_id=f"{self.request_id}.{i}", deadline=self._deadline)
                    )
            except Exception as exc:
                if not self._handles:
                    raise  # nothing runs yet: the caller sees the submit's own error
                self._abort_locked()
                raise RequestFailed("", f"part {len(self._handles) + 1} of {len(self._parts)} could not start: {exc}") from exc

    def _reading(self) -> RequestHandle | None:
        """The part to read now, None once every part has been read or the request was aborted."""
        with self._lock:
            if self._aborted or self._current >= len(self._parts):
                return None
            return self._handles[self._current]

    def _part_over(self, handle: RequestHandle) -> None:
        if handle.aborted:  # stopped from outside (a drain, a shutdown): so is the whole request
            self.abort()
            return
        self._current += 1
        self._submit_due()

    def _fold(self, event: OutputEvent) -> OutputEvent:
        """The part's event as an event of the whole request (end flags and usage folded)."""
        last = self._current == len(self._parts) - 1
        payload = event.payload
        if "usage" in payload:
            for key, value in (payload["usage"] or {}).items():
                summable = isinstance(value, (int, float)) and not isinstance(value, bool)
                self._usage[key] = self._usage.get(key, 0) + value if summable else value
            payload = {k: v for k, v in payload.items() if k != "usage"}
        end = event.end and last
        if end and self._usage:
            payload = {**payload, "usage": dict(self._usage)}
        seq = self._seq.get(event.name, 0)
        self._seq[event.name] = seq + 1
        return OutputEvent(event.name, payload, end, seq)

    # -- caller side ------------------------------------------------------------------------------

    def get(self, timeout: float | None = None) -> OutputEvent | None:
        """The next event, ``None`` once every part is over; ``TimeoutError`` after ``timeout``
        without one."""
        while (handle := self._reading()) is not None:
            try:
                event = handle.get(timeout=timeout)
            except RequestFailed:
                self.abort()
                raise
            if event is not None:
                return self._fold(event)
            self._part_over(handle)
        return None

    async def __aiter__(self):
        while (handle := self._reading()) is not None:
            try:
                async for event in handle:
                    yield self._fold(event)
            except RequestFailed:
                self.abort()
                raise
            self._part_over(handle)

    def abort(self) -> None:
        with self._lock:
            self._abort_locked()

    def _abort_locked(self) -> None:
        self._aborted = True
        for handle in self._handles:
            handle.abort()

    @property
    def aborted(self) -> bool:
        with self._lock:
            return self._aborted or any(h.aborted for h in self._handles)

    @property
    def error(self) -> RequestFailed | None:
        """What the part that failed failed with (the others were aborted); None otherwise."""
        with self._lock:
            handles = list(self._handles)
        return next((h.error for h in handles if h.error is not None), None)

    @property
    def done(self) -> bool:
        with self._lock:
            if self._aborted:
                return True
            return len(self._handles) == len(self._parts) and all(h.done for h in self._handles)
