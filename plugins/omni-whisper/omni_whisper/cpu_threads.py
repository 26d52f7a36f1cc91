"""How the encoder and decoder threads of one process share the CPU.

``shared``: each stage uses torch's whole intra-op pool and they take turns through a FIFO lock
(two pools on the same cores slow each other down). ``split``: every compute thread runs
single-threaded and no lock is taken: the decoder steps on one thread while the encoder encodes
one window per core on a small pool, and the OS spreads them over the cores; only a lone window
encoded while no decoder of the process has rows (one request at a time) uses every core.
Small decoder matmuls gain nothing from a second thread, and a parallel region waits for its
slowest thread, so on a busy machine (another process holding a core) single-threaded work
loses far less.

torch's intra-op thread count is per thread (OpenMP), so each thread sets its own; a thread
that first runs torch later in the process starts with the last count any thread set.
"""

from __future__ import annotations

import contextlib
import os
import threading

import torch

THREAD_MODES = ("shared", "split")


class TurnLock:
    """A first-come first-served lock. FIFO, so a decoder stepping in a loop cannot starve the encoder."""

    def __init__(self):
        self._cond = threading.Condition()
        self._next_ticket = 0
        self._serving = 0

    def __enter__(self) -> None:
        with self._cond:
            ticket = self._next_ticket
            self._next_ticket += 1
            while ticket != self._serving:
                self._cond.wait()

    def __exit__(self, *exc) -> None:
        with self._cond:
            self._serving += 1
            self._cond.notify_all()


COMPUTE_LOCK = TurnLock()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def check_mode(mode: str) -> str:
    if mode not in THREAD_MODES:
        raise ValueError(f"whisper: threads must be one of {', '.join(THREAD_MODES)}, not {mode!r}")
    return mode


def compute_threads(mode: str) -> int | None:
    """Intra-op threads of each compute thread; None keeps torch's setting (all cores)."""
    return 1 if check_mode(mode) == "split" else None


def encoder_workers(mode: str) -> int:
    """Windows the encoder runs at once, each on its own thread."""
    return cpu_count() if check_mode(mode) == "split" else 1


def turn_lock(mode: str):
    """The lock a stage's compute takes: the shared FIFO lock, or none when stages are split."""
    return COMPUTE_LOCK if mode == "shared" else contextlib.nullcontext()


class BusyDecoders:
    """Which decoders of this process have rows to step; the encoder reads it."""

    def __init__(self):
        self._busy: set[int] = set()
        self._lock = threading.Lock()

    def mark(self, decoder: object, busy: bool) -> None:
        with self._lock:
            (self._busy.add if busy else self._busy.discard)(id(decoder))

    def any(self) -> bool:
        return bool(self._busy)


BUSY_DECODERS = BusyDecoders()


class ThreadSetter:
    """Sets the calling thread's intra-op threads once (stages run on threads the engine owns)."""

    def __init__(self, threads: int | None):
        self.threads = threads
        self._done = threading.local()

    def __call__(self) -> None:
        if self.threads is not None and not getattr(self._done, "value", False):
            torch.set_num_threads(self.threads)
            self._done.value = True
