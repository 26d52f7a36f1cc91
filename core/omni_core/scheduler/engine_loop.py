"""A thread that owns an AREngine and steps it while work exists.

Other threads talk to it only through commands (add, abort, stop) in a queue, so the engine
itself is never touched concurrently. Aborts are applied between steps, freeing KV blocks
before the next step is scheduled. An engine whose ``EngineConfig.stream`` is not "shared" runs
its steps and commands on a stream of its own (``StageStream``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

from omni_core.scheduler.engine import AREngine, EngineRequest, RequestOutput
from omni_core.scheduler.stage_stream import StageStream

log = logging.getLogger(__name__)


class EngineLoop:
    """``on_outputs(outputs)`` gets each step's outputs; ``on_error(request_id, message)`` gets
    requests that could not be added or whose step failed (they are already aborted);
    ``on_abort(request_id)`` runs once an abort is applied (no output for it follows)."""

    def __init__(
        self,
        engine: AREngine,
        on_outputs: Callable[[list[RequestOutput]], None],
        on_error: Callable[[str, str], None],
        name: str = "ar-engine",
        on_abort: Callable[[str], None] | None = None,
    ):
        self.engine = engine
        self.on_abort = on_abort
        self.on_outputs = on_outputs
        self.on_error = on_error
        self.commands: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.stats: dict[str, float] = engine.stats()
        self.cancelled: set[str] = set()
        stream = engine.config.stream
        self.stream = None if stream == "shared" else StageStream(engine.device, high_priority=stream == "high")

    def _on_stream(self):
        return nullcontext() if self.stream is None else self.stream()

    def adopt(self, payload: Any) -> Any:
        """A request's input, made safe to read on the engine's stream (in the loop thread)."""
        return payload if self.stream is None else self.stream.adopt(payload)

    def start(self) -> None:
        self.thread.start()

    def add(self, request_id: str, build: Callable[[], EngineRequest]) -> None:
        """Queue a request; ``build`` runs in the loop thread (it may raise: the request fails)."""
        self.commands.put(("add", (request_id, build, time.perf_counter())))

    def call(self, request_id: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` in the loop thread between steps if ``request_id`` is still in the engine
        (input for a running request: a later chunk of the stream it is fed from); an exception
        fails that request."""
        self.commands.put(("call", (request_id, fn)))

    def abort(self, request_id: str) -> None:
        self.commands.put(("abort", request_id))

    def stop(self, timeout: float = 10.0) -> None:
        self.commands.put(("stop", None))
        if self.thread.is_alive():
            self.thread.join(timeout)

    def _apply(self, command: str, arg: Any) -> bool:
        if command == "stop":
            return False
        if command == "abort":
            if not self.engine.abort(arg) and len(self.cancelled) < 100_000:
                self.cancelled.add(arg)  # aborted before its add was applied
            if self.on_abort is not None:
                self.on_abort(arg)
            self.stats = self.engine.stats()
        elif command == "call":
            request_id, fn = arg
            if request_id in self.engine.requests:
                try:
                    fn()
                except Exception as exc:
                    self.engine.abort(request_id)
                    self.on_error(request_id, f"{type(exc).__name__}: {exc}")
        elif command == "add":
            request_id, build, queued_at = arg
            if log.isEnabledFor(logging.DEBUG):  # with the step timeline: when a request got in
                log.debug("%s: request %s taken in %.1f ms after it arrived", self.thread.name, request_id, (time.perf_counter() - queued_at) * 1e3)
            if request_id in self.cancelled:
                self.cancelled.discard(request_id)
                return True
            try:
                request = build()
            except Exception as exc:  # bad input fails this request only
                self.on_error(request_id, f"{type(exc).__name__}: {exc}")
                return True
            try:
                self.engine.add_request(request)
            except ValueError as exc:
                # the engine can never run it (too long for max_model_len, ids outside the
                # vocabulary): the request's content is at fault, which the server answers with a 400
                self.on_error(request_id, f"InvalidInput: {exc}")
            except Exception as exc:
                self.on_error(request_id, f"{type(exc).__name__}: {exc}")
        return True

    def _run(self) -> None:
        running = True
        while running:
            # block only when no step can run (idle, or every request waits for input);
            # otherwise drain what arrived since the last step
            try:
                if not self.engine.has_runnable():
                    command = self.commands.get()
                    with self._on_stream():
                        running = self._apply(*command)
                while running:
                    command = self.commands.get_nowait()
                    with self._on_stream():
                        running = self._apply(*command)
            except queue.Empty:
                pass
            if not running or not self.engine.has_runnable():
                continue
            with self._on_stream():
                self._step()
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)

    def _step(self) -> None:
        try:
            started = time.perf_counter()
            outputs = self.engine.step()
            if log.isEnabledFor(logging.DEBUG):  # the step timeline, for `--log-level debug`
                kind, count = self.engine.last_step
                log.debug("%s: %s of %d sequences, %.1f ms", self.thread.name, kind, count, (time.perf_counter() - started) * 1e3)
        except Exception as exc:
            log.exception("engine step failed")
            self._fail_all(f"engine step failed: {type(exc).__name__}: {exc}")
            return
        self.stats = self.engine.stats()
        try:
            self.on_outputs(outputs)
        except Exception:
            log.exception("output handler failed")

    def _fail_all(self, message: str) -> None:
        for request_id in list(self.engine.requests):
            self.engine.abort(request_id)
            self.on_error(request_id, message)
