"""The ``fn`` and ``batch`` executors: non-autoregressive stages (frontends, encoders, vocoders).

Both run the stage's worker on one thread fed by a bounded queue. ``fn`` calls
``worker(message, emit)`` once per message. ``batch`` groups messages of concurrent requests
within ``options["batch_window_ms"]`` up to ``options["max_batch"]`` and calls
``worker.process(messages, emit)``; a batch holds at most one message per request, so a stream's
chunks reach the worker in order and never two at once. A batch worker with ``choose(heads)``
picks which requests run next (their oldest messages) instead of arrival order: how a stage
schedules by deadline.

A worker may define ``release(request_id)`` to free what it keeps per request: it is called on
the worker's thread, between calls, after the request finishes and after it is aborted, so it
may run twice for one request, or for a request the worker never saw (aborted while queued):
make it idempotent (``dict.pop(request_id, None)``).

A worker exception fails only the request(s) it concerns. ``fn`` emits as the worker calls
``emit`` (streams flow chunk by chunk); ``batch`` emits after ``process`` returns, so a failed
batch can be retried one message at a time without emitting anything twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import traceback
from collections import deque
from typing import Any

from omni_core.scheduler.executor import Executor, Message, StageContext

DEFAULT_MAX_QUEUE = 1024
log = logging.getLogger("omni.stage")


class RequestGone(Exception):
    """Raised inside a worker's ``emit`` when its request was aborted or failed meanwhile, so a
    long call (a loop emitting chunks) stops at its next emit; the executor swallows it."""


def fail_request(context: StageContext, request_id: str, exc: BaseException, what: str = "") -> None:
    """Fails a request for a worker's exception: the client gets ``describe_error``, the server's
    log the traceback. ``InvalidInput`` (the request's content, not the stage, is at fault) is a
    400 whose message is the family's alone (``InputTooLarge``: a 413); where it was raised goes
    to the log, one line."""
    if type(exc).__name__ in ("InvalidInput", "InputTooLarge"):
        log.info("stage %r refused request %s: %s%s", context.stage, request_id, exc, _where(exc))
        context.fail(request_id, f"{what}{type(exc).__name__}: {exc}")
        return
    log.warning("stage %r failed request %s", context.stage, request_id, exc_info=exc)
    context.fail(request_id, f"{what}{describe_error(exc)}")


def describe_error(exc: BaseException) -> str:
    """``Type: message`` plus the innermost frame's file name and line, enough to find the
    failing line (clients see this: not the server's directories)."""
    return f"{type(exc).__name__}: {exc}{_where(exc)}"


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""


class _QueuedExecutor(Executor):
    """A bounded message queue drained by one worker thread; per-request state keyed by id."""

    thread_label = "stage"

    def __init__(self, stage: Any, context: StageContext):
        super().__init__(stage, context)
        options = {**getattr(stage, "options", {}), **context.options}
        self.options = options
        self.max_queue = int(options.get("max_queue", DEFAULT_MAX_QUEUE))
        self._queue: deque[Message] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._seq: dict[tuple[str, str], int] = {}  # (request id, output port) -> next seq
        self._seq_lock = threading.Lock()
        self._known: set[str] = set()  # requests that reached this stage and are not released
        self._to_release: set[str] = set()  # released or aborted; the worker thread frees them
        self.worker: Any = None
        self.processed = 0
        self.busy = 0  # worker calls in progress

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self.worker = self.stage.factory(self.context)
        self._check_worker(self.worker)
        self._thread = threading.Thread(
            target=self._run, name=f"omni-{self.thread_label}-{self.context.stage}", daemon=True
        )
        self._thread.start()

    def _check_worker(self, worker: Any) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._queue.clear()
            self._known.clear()  # a running call ends at its next emit
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _wait_for_work(self) -> bool:
        """With the lock held: wait for a message or a release; False once the executor stops."""
        while not self._queue and not self._to_release and not self._stopping:
            self._cond.wait()
        return not self._stopping

    def _take_releases(self) -> list[str]:
        """With the lock held: the requests to free before the next call."""
        released = list(self._to_release)
        self._to_release.clear()
        return released

    # -- requests ---------------------------------------------------------------------------------

    def submit(self, message: Message) -> None:
        """Queue a message. When the queue is full the caller waits (backpressure upstream)."""
        with self._cond:
            while len(self._queue) >= self.max_queue and not self._stopping:
                self._cond.wait(timeout=0.1)
            if self._stopping:
                return
            self._known.add(message.request_id)
            self._queue.append(message)
            self._cond.notify_all()

    def abort(self, request_id: str) -> None:
        with self._cond:
            if any(m.request_id == request_id for m in self._queue):
                self._queue = deque(m for m in self._queue if m.request_id != request_id)
                self._cond.notify_all()
        self.release(request_id)

    def release(self, request_id: str) -> None:
        """The request finished (or was aborted): its state is freed on the worker thread,
        between calls, so a call still running for it cannot write its state back afterwards."""
        with self._cond:
            self._known.discard(request_id)
            self._to_release.add(request_id)
            self._cond.notify_all()

    def _free(self, request_ids: list[str]) -> None:
        """On the worker thread: drop the requests' sequence numbers and the worker's state."""
        with self._seq_lock:
            gone = set(request_ids)
            for key in [k for k in self._seq if k[0] in gone]:
                del self._seq[key]
        release = getattr(self.worker, "release", None)
        if release is None:
            return
        for request_id in request_ids:
            try:
                release(request_id)
            except Exception as exc:  # a broken release must not stop the stage
                fail_request(self.context, request_id, exc, "release failed: ")

    def stats(self) -> dict[str, float]:
        with self._cond:
            return {
                "queue_depth": len(self._queue),
                "running": len(self._known),
                "busy": self.busy,
                "processed": self.processed,
            }

    # -- worker side ------------------------------------------------------------------------------

    def _next_seq(self, request_id: str, port: str) -> int:
        with self._seq_lock:
            seq = self._seq.get((request_id, port), 0)
            self._seq[(request_id, port)] = seq + 1
            return seq

    def _flush(self, pending: list[tuple[str, str, dict, bool]]) -> None:
        for request_id, port, payload, end in pending:
            if request_id not in self._known:
                continue  # aborted while the worker ran
            self.context.emit(Message(request_id, port, payload, end, self._next_seq(request_id, port)))

    def _run(self) -> None:
        raise NotImplementedError


class FnExecutor(_QueuedExecutor):
    """One call of ``worker(message, emit)`` per message; ``emit(port, payload, end=True)``."""

    thread_label = "fn"

    def _check_worker(self, worker: Any) -> None:
        if not callable(worker):
            raise TypeError(
                f"stage {self.context.stage!r}: an 'fn' factory must return a callable "
                f"worker(message, emit), got {type(worker).__name__}"
            )

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._wait_for_work():
                    return
                released = self._take_releases()
                message = self._queue.popleft() if self._queue else None
                self._cond.notify_all()
            self._free(released)
            if message is not None:
                self._call(message)

    def _call(self, message: Message) -> None:
        """Emits go out as the worker makes them (a stream's first chunk must not wait for the
        last); an emit after the request is gone raises ``RequestGone`` to stop the call."""
        request_id = message.request_id

        def emit(port: str, payload: dict | None = None, end: bool = True) -> None:
            if request_id not in self._known:
                raise RequestGone(request_id)
            seq = self._next_seq(request_id, port)
            self.context.emit(Message(request_id, port, payload if payload is not None else {}, end, seq))

        self.busy = 1
        try:
            self.worker(message, emit)
            self.processed += 1
        except RequestGone:
            pass
        except Exception as exc:
            fail_request(self.context, request_id, exc)
        finally:
            self.busy = 0


class BatchExecutor(_QueuedExecutor):
    """Groups messages of different requests: ``worker.process(messages, emit)`` with
    ``emit(request_id, port, payload, end=True)``. Options: ``batch_window_ms`` (default 2),
    ``max_batch`` (default 16), ``max_queue``."""

    thread_label = "batch"

    def __init__(self, stage: Any, context: StageContext):
        super().__init__(stage, context)
        self.window_s = float(self.options.get("batch_window_ms", 2.0)) / 1000.0
        self.max_batch = max(1, int(self.options.get("max_batch", 16)))
        self.batches = 0

    def _check_worker(self, worker: Any) -> None:
        if not callable(getattr(worker, "process", None)):
            raise TypeError(
                f"stage {self.context.stage!r}: a 'batch' factory must return an object with "
                f"process(messages, emit), got {type(worker).__name__}"
            )

    def _take_batch(self) -> list[Message]:
        """Called with the lock held and the queue non-empty: one message per request, oldest
        first, or those the worker's ``choose`` picks among each request's oldest."""
        choose = getattr(self.worker, "choose", None)
        if choose is not None:
            return self._take_chosen(choose)
        batch: list[Message] = []
        seen: set[str] = set()
        rest: deque[Message] = deque()
        while self._queue and len(batch) < self.max_batch:
            message = self._queue.popleft()
            if message.request_id in seen:
                rest.append(message)
            else:
                seen.add(message.request_id)
                batch.append(message)
        rest.extend(self._queue)
        self._queue = rest
        self._cond.notify_all()
        return batch

    def _take_chosen(self, choose) -> list[Message]:
        """The worker orders the work (a deadline scheduler): it gets each request's oldest
        message, in arrival order, and returns those to run now, most urgent first; the rest
        stay queued. At least the first it returns runs (or the oldest, if it returns none), and
        at most ``max_batch``."""
        heads: dict[str, Message] = {}
        for message in self._queue:
            heads.setdefault(message.request_id, message)
        candidates = list(heads.values())
        try:
            order = list(choose(candidates))
        except Exception:  # a broken scheduler must not stop the stage: arrival order this time
            log.exception("stage %r: choose failed; taking the oldest messages", self.context.stage)
            order = candidates
        batch: list[Message] = []
        taken: set[int] = set()
        for message in order:
            if heads.get(message.request_id) is message and id(message) not in taken and len(batch) < self.max_batch:
                batch.append(message)
                taken.add(id(message))
        if not batch:
            batch, taken = candidates[:1], {id(candidates[0])}
        self._queue = deque(m for m in self._queue if id(m) not in taken)
        self._cond.notify_all()
        return batch

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._wait_for_work():
                    return
                released = self._take_releases()
                if self._queue:
                    deadline = time.monotonic() + self.window_s
                    while len({m.request_id for m in self._queue}) < self.max_batch and not self._stopping:
                        left = deadline - time.monotonic()
                        if left <= 0:
                            break
                        self._cond.wait(timeout=left)
                    if self._stopping:
                        return
                    released += self._take_releases()
                batch = self._take_batch() if self._queue else []
            self._free(released)
            if batch:
                self._process(batch)

    def _call(self, messages: list[Message]) -> list[tuple[str, str, dict, bool]]:
        pending: list[tuple[str, str, dict, bool]] = []

        def emit(request_id: str, port: str, payload: dict | None = None, end: bool = True) -> None:
            pending.append((request_id, port, payload if payload is not None else {}, end))

        self.worker.process(messages, emit)
        return pending

    def _process(self, batch: list[Message]) -> None:
        self.busy = 1
        try:
            self._process_batch(batch)
        finally:
            self.busy = 0

    def _process_batch(self, batch: list[Message]) -> None:
        try:
            started = time.perf_counter()
            pending = self._call(batch)
            if log.isEnabledFor(logging.DEBUG):  # the call timeline, for `--log-level debug`
                log.debug("stage %r: call of %d requests, %.1f ms", self.context.stage, len(batch), (time.perf_counter() - started) * 1e3)
        except Exception as exc:
            if len(batch) == 1:
                fail_request(self.context, batch[0].request_id, exc)
                return
            for message in batch:  # find the request that broke the batch; the others go on
                self._process_batch([message])
            return
        self.batches += 1
        self.processed += len(batch)
        self._flush(pending)

    def stats(self) -> dict[str, float]:
        stats = super().stats()
        stats["batches"] = self.batches
        stats["mean_batch_size"] = self.processed / self.batches if self.batches else 0.0
        return stats
