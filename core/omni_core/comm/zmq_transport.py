"""Tensors as zmq frames beside the msgpack metadata: works over tcp, across hosts.

The sender hands zmq a view of each tensor's memory (no copy on the Python side); the receiver
wraps the received frames with ``torch.frombuffer`` (no copy either). Tensors on a GPU are
copied to host memory first.
"""

from __future__ import annotations

from typing import Any

from omni_core.comm import framing
from omni_core.comm.base import Transport


class ZmqTransport(Transport):
    name = "zmq"

    def pack(self, request_id: str, payload: dict[str, Any], peer: int = 0) -> list[Any]:
        encoded = framing.encode(payload)
        header = framing.pack_header({"body": encoded.body, "tensors": encoded.meta})
        return [header, *(framing.as_bytes(t).numpy() for t in encoded.tensors)]

    def unpack(self, frames: list[Any], peer: int = 0) -> dict[str, Any]:
        header = framing.unpack_header(_buffer(frames[0]))
        meta = header.get("tensors", [])
        if len(frames) != len(meta) + 1:
            raise framing.FramingError(f"expected {len(meta)} tensor frames, got {len(frames) - 1}")
        tensors = [framing.wrap(_buffer(frame), m) for frame, m in zip(frames[1:], meta, strict=False)]
        return framing.decode(header["body"], tensors)


def _buffer(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame
