"""Request deadlines: one thread per pipeline, asleep until the nearest one, that tells the
runtime when a request has run past its own."""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class DeadlineWatch:
    """Calls ``expire(request_id, deadline)`` once ``time.monotonic()`` passes a deadline given to
    ``add``, unless ``discard`` came first (the request ended). The runtime checks again, under its
    own lock, that the request is still the one that deadline was set for."""

    def __init__(self, expire: Callable[[str, float], None], name: str = "omni-deadlines"):
        self._expire = expire
        self._name = name
        self._heap: list[tuple[float, str]] = []
        self._live: dict[str, float] = {}  # request id -> its deadline, while the request runs
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    def add(self, request_id: str, deadline: float) -> None:
        with self._cond:
            if self._closed:
                return
            self._live[request_id] = deadline
            heapq.heappush(self._heap, (deadline, request_id))
            if self._thread is None:  # started by the first request that has a deadline
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()

    def discard(self, request_id: str, deadline: float | None) -> None:
        """The request ended before ``deadline`` (None: it had none)."""
        if deadline is None:
            return
        with self._cond:
            if self._live.get(request_id) != deadline:
                return  # not this request's (its id was reused) or already due
            del self._live[request_id]
            # entries of ended requests stay in the heap until due; rebuild it when they dominate,
            # so that a long timeout under heavy traffic does not hold every finished request's id
            if len(self._heap) > 2 * len(self._live) + 64:
                self._heap = [(d, r) for r, d in self._live.items()]
                heapq.heapify(self._heap)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._heap.clear()
            self._live.clear()
            self._cond.notify()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=2)

    def _due(self) -> list[tuple[str, float]] | None:
        """Waits until some deadline is due; those due, or None once closed."""
        with self._cond:
            while not self._closed:
                now = time.monotonic()
                due = []
                while self._heap and self._heap[0][0] <= now:
                    deadline, request_id = heapq.heappop(self._heap)
                    if self._live.get(request_id) == deadline:
                        del self._live[request_id]
                        due.append((request_id, deadline))
                if due:
                    return due
                # capped: a lock's wait refuses a timeout past threading.TIMEOUT_MAX (a deadline
                # years away is legal); waking once an hour to look again costs nothing
                self._cond.wait(min(self._heap[0][0] - now, 3600.0) if self._heap else None)
            return None

    def _run(self) -> None:
        while (due := self._due()) is not None:
            for request_id, deadline in due:  # outside the lock: expiring aborts in every stage
                try:
                    self._expire(request_id, deadline)
                except Exception:  # one request's cleanup must not stop the others' deadlines
                    log.exception("expiring request %s failed", request_id)
