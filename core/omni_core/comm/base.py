"""What a transport is: how a payload's tensors move from one process (or host) to another.

``pack(request_id, payload)`` returns the frames to send (the first is msgpack metadata);
``unpack(frames)`` rebuilds the payload on the receiving side. ``release(request_id)`` frees
whatever the transport still holds for a finished or aborted request, ``release_process(pid)``
what a dead process left behind, ``close()`` everything.
The control plane (zmq sockets of the pipeline runtime) carries the frames.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class TransportUnavailable(RuntimeError):
    """The transport cannot run here (no GPU for nccl...): the message says why and what to use."""


class Transport(ABC):
    name = "base"
    supports_restart = True  # whether a stage process may be replaced while the pipeline runs

    def __init__(self, prefix: str = "omni", **options: Any):
        self.prefix = prefix
        self.options = options

    @abstractmethod
    def pack(self, request_id: str, payload: dict[str, Any], peer: int = 0) -> list[Any]:
        """Frames for one payload sent to ``peer`` (the receiving process's rank: 0 is the runtime,
        stage processes count from 1)."""

    @abstractmethod
    def unpack(self, frames: list[Any], peer: int = 0) -> dict[str, Any]:
        """The payload of frames received from ``peer``."""

    def flush(self, peer: int = 0) -> None:
        """Called right after the frames of ``pack`` were sent: a transport that moves tensors
        outside the frames (torch.distributed) sends them now, in the same order as the frames."""
        return None

    def peer_options(self, peer: int) -> dict[str, Any]:
        """Extra factory options for the transport of the stage process of rank ``peer``."""
        return {}

    def release(self, request_id: str) -> None:
        """Free what is still held for the request (unconsumed buffers)."""
        return None

    def release_process(self, pid: int) -> None:
        """Free what a process of this pipeline left behind when it died."""
        return None

    def close(self) -> None:
        """Free everything this transport's prefix still holds."""
        return None
