"""Which stream chunks a batch stage's worker has applied already.

A ``batch`` executor retries a failed batch one message at a time, so a worker that keeps state
per request must apply each chunk once; and a chunk still in flight when its request was
released (ended or aborted) must create no state that nothing would free.
"""

from __future__ import annotations

from collections import OrderedDict


class AppliedMessages:
    """The last applied ``seq`` per (request, port), and the requests released lately."""

    RELEASED_MEMORY = 4096

    def __init__(self):
        self.last: dict[tuple[str, str], int] = {}
        self.released: OrderedDict[str, None] = OrderedDict()

    def fresh(self, message) -> bool:
        """True the first time a message of a live request is seen (then it counts as applied)."""
        if message.request_id in self.released:
            return False
        key = (message.request_id, message.port)
        if self.last.get(key, -1) >= message.seq:
            return False
        self.last[key] = message.seq
        return True

    def forget(self, request_id: str) -> None:
        """The request is released: its later messages are not fresh."""
        for key in [k for k in self.last if k[0] == request_id]:
            del self.last[key]
        self.released[request_id] = None
        while len(self.released) > self.RELEASED_MEMORY:
            self.released.popitem(last=False)
