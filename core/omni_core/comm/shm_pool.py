"""Reusable shared-memory segments of one sending process.

Writing into fresh shared memory costs a page fault and a zeroed page per 4 KiB, as much as a
copy; a segment whose pages were already touched is much cheaper to refill. Each pooled segment
starts with a control byte: the sender sets it to 1 when it hands the segment to a receiver,
and the receiver sets it back to 0 when the last tensor over its mapping is freed (a finalizer on
the mapping). The sender refills only segments whose byte is 0.

A segment sent for a request that finished or aborted while the receiver still holds it (or never
received it) is retired: unlinked and dropped from the pool, so the pool never waits on it.
"""

from __future__ import annotations

import itertools
import mmap
import os
import threading

CONTROL_BYTES = 64  # the control byte, padded so tensor data stays aligned
MIN_SEGMENT = 1 << 20
FREE, HELD = 0, 1


class Segment:
    __slots__ = ("name", "path", "capacity", "mapping", "generation")

    def __init__(self, name: str, path: str, capacity: int, mapping: mmap.mmap):
        self.name, self.path, self.capacity, self.mapping = name, path, capacity, mapping
        self.generation = 0

    @property
    def free(self) -> bool:
        return self.mapping[0] == FREE


class SegmentPool:
    def __init__(self, directory: str, prefix: str, limit_bytes: int):
        self.directory = directory
        self.prefix = prefix
        self.limit_bytes = limit_bytes
        self.segments: list[Segment] = []
        self.total_bytes = 0
        self._held: dict[str, list[tuple[Segment, int]]] = {}  # request id -> (segment, generation)
        self._lock = threading.Lock()
        self._counter = itertools.count()

    def acquire(self, request_id: str, nbytes: int) -> Segment | None:
        """A free segment with room for ``nbytes`` after the control bytes, marked held; None
        when the pool is at its limit (the caller then uses a one-off segment)."""
        need = nbytes + CONTROL_BYTES
        with self._lock:
            fitting = [s for s in self.segments if s.capacity >= need and s.free]
            segment = min(fitting, key=lambda s: s.capacity) if fitting else self._grow(need)
            if segment is None:
                return None
            segment.mapping[0] = HELD
            segment.generation += 1
            self._held.setdefault(request_id, []).append((segment, segment.generation))
            return segment

    def _grow(self, need: int) -> Segment | None:
        capacity = max(MIN_SEGMENT, 1 << (need - 1).bit_length())
        for small in sorted((s for s in self.segments if s.free), key=lambda s: s.capacity):
            if self.total_bytes + capacity <= self.limit_bytes:
                break
            self._retire(small)  # make room: free segments too small for today's messages
        if self.total_bytes + capacity > self.limit_bytes:
            return None
        name = f"{self.prefix}-pool-{os.getpid()}-{next(self._counter)}"
        path = os.path.join(self.directory, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, capacity)
            mapping = mmap.mmap(fd, capacity, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        segment = Segment(name, path, capacity, mapping)
        self.segments.append(segment)
        self.total_bytes += capacity
        return segment

    def _retire(self, segment: Segment) -> None:
        """With the lock held: unlink and forget (a receiver's mapping stays valid until it drops it)."""
        self.segments.remove(segment)
        self.total_bytes -= segment.capacity
        try:
            os.unlink(segment.path)
        except FileNotFoundError:
            pass
        segment.mapping.close()

    def release(self, request_id: str) -> None:
        with self._lock:
            for segment, generation in self._held.pop(request_id, ()):
                if segment.generation == generation and not segment.free and segment in self.segments:
                    self._retire(segment)

    def close(self) -> None:
        with self._lock:
            for segment in list(self.segments):
                self._retire(segment)
            self._held.clear()


def map_for_receiver(path: str, capacity: int) -> mmap.mmap:
    """Map a pooled segment; when the returned mapping is freed (its last tensor is gone), the
    segment's control byte goes back to FREE so the sender may refill it."""
    import weakref

    fd = os.open(path, os.O_RDWR)
    try:
        if os.fstat(fd).st_size != capacity:
            raise ValueError(f"segment {os.path.basename(path)} has the wrong size")
        data = mmap.mmap(fd, capacity)
        control = mmap.mmap(fd, CONTROL_BYTES)
    finally:
        os.close(fd)
    weakref.finalize(data, _mark_free, control)
    return data


def _mark_free(control: mmap.mmap) -> None:
    try:
        control[0] = FREE
        control.close()
    except ValueError:  # already closed at interpreter exit
        pass
