"""What every stage executor is: the interface between the pipeline runtime and an engine.

The runtime hands an executor ``Message``s (``submit``) and receives its results through the
``StageContext.emit`` callback; both may be called from any thread. An executor owns its worker
thread(s) and all per-request state, keyed by request id and freed on finish or ``abort``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Message:
    """One payload crossing an edge.

    ``port`` is the input name on the receiving side, the output name on the emitting side.
    ``payload`` maps names to plain values (str, int, float, bool, None, bytes, lists, dicts) and
    tensors (torch or numpy). On a stream edge, chunks carry increasing ``seq`` and the last
    message of a request has ``end=True`` (its payload may be empty). On a message edge there is
    exactly one message per request, with ``end=True``.
    """

    request_id: str
    port: str
    payload: dict[str, Any] = field(default_factory=dict)
    end: bool = True
    seq: int = 0


@dataclass
class StageContext:
    """What an executor gets from the runtime in the process that hosts its stage."""

    stage: str
    device: str
    emit: Callable[[Message], None]
    fail: Callable[[str, str], None]  # (request_id, error message): fails that request only
    options: dict[str, Any] = field(default_factory=dict)
    platform: Any = None
    plugin_manager: Any = None
    family: str = ""  # the family whose topology holds the stage (its Topology.name)


class Executor(ABC):
    """Runs one stage. ``start`` builds the worker (loads weights) in the hosting process."""

    def __init__(self, stage: Any, context: StageContext):
        self.stage = stage
        self.context = context

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def submit(self, message: Message) -> None:
        """Queue a message for this stage; thread-safe and non-blocking."""

    @abstractmethod
    def abort(self, request_id: str) -> None:
        """Drop a request: stop its work and free its state (KV blocks, caches); thread-safe."""

    @abstractmethod
    def stop(self) -> None: ...

    def stats(self) -> dict[str, float]:
        """Gauges for /metrics: queue depth, running requests, KV-cache use."""
        return {}
