"""The pipeline's deadline thread: expires what is due, in order, once; forgets what ended; keeps
its heap bounded by the requests still running; takes a deadline years away."""

from __future__ import annotations

import threading
import time

from omni_core.pipeline.deadlines import DeadlineWatch


class Expired:
    def __init__(self):
        self.calls: list[str] = []
        self.event = threading.Event()

    def __call__(self, request_id: str, deadline: float) -> None:
        assert time.monotonic() >= deadline
        self.calls.append(request_id)
        if request_id in ("last", "after"):
            self.event.set()


def test_due_deadlines_expire_once_in_order_and_discarded_ones_never():
    expired = Expired()
    watch = DeadlineWatch(expired)
    now = time.monotonic()
    try:
        watch.add("second", now + 0.10)
        watch.add("first", now + 0.05)
        watch.add("ended", now + 0.07)
        watch.discard("ended", now + 0.07)
        watch.add("reused", now + 0.08)
        watch.add("reused", now + 0.20)  # the id now names a later request: only its deadline counts
        watch.discard("second", now + 99)  # not its deadline: nothing is discarded
        watch.add("years away", now + 10**11)  # further than a lock may wait (threading.TIMEOUT_MAX)
        watch.add("last", now + 0.25)
        assert expired.event.wait(5)
        assert expired.calls == ["first", "second", "reused", "last"]
        expired.event.clear()
        time.sleep(0.1)  # the thread now waits for the deadline years away
        watch.add("after", time.monotonic() + 0.05)
        assert expired.event.wait(5) and expired.calls[-1] == "after"
    finally:
        watch.close()


def test_ended_requests_do_not_pile_up_in_the_heap():
    watch = DeadlineWatch(Expired())
    far = time.monotonic() + 3600
    try:
        for i in range(1000):
            watch.add(f"r{i}", far + i)
            watch.discard(f"r{i}", far + i)
        assert len(watch._heap) <= 64 + 1 and watch._live == {}
    finally:
        watch.close()
