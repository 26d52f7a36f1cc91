"""Same-process transport: the payload object itself is the frame; nothing is copied."""

from __future__ import annotations

from typing import Any

from omni_core.comm.base import Transport


class InprocTransport(Transport):
    name = "inproc"

    def pack(self, request_id: str, payload: dict[str, Any], peer: int = 0) -> list[Any]:
        return [payload]

    def unpack(self, frames: list[Any], peer: int = 0) -> dict[str, Any]:
        return frames[0]
