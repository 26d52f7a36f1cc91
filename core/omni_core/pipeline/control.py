"""The control plane between the runtime and a stage process: zmq PUSH/PULL pairs carrying
multipart messages ``[msgpack header, *transport frames]``.

Header ``op``s, runtime -> stage: ``msg`` (rid, port, end, seq + a payload), ``abort`` and
``release`` (rid), ``stop``. Stage -> runtime: ``ready``, ``error`` (startup failed: message),
``emit`` (rid, port, end, seq + a payload), ``fail`` (rid, error), ``stats`` (the executor's).
"""

from __future__ import annotations

import threading
from typing import Any

import zmq

from omni_core.comm import framing
from omni_core.scheduler.executor import Message


def bind_address(socket: zmq.Socket, control: str, ipc_path: str, host: str = "127.0.0.1") -> str:
    """Bind to an ipc path or a free tcp port on ``host`` (127.0.0.1 unless the stage runs on
    another node); returns the address peers connect to."""
    if control == "ipc":
        address = f"ipc://{ipc_path}"
        socket.bind(address)
        return address
    if control == "tcp":
        port = socket.bind_to_random_port(f"tcp://{host}")
        return f"tcp://{host}:{port}"
    raise ValueError(f"control must be 'ipc' or 'tcp', got {control!r}")


class Channel:
    """One direction of the control plane. Two locks: ``_socket`` around each use of the zmq
    socket (not thread-safe), and ``_order`` around a payload's framing, header and transport
    flush, so headers go out in the order their tensors are sent. A header without a payload
    (stats, abort, release, fail) takes only ``_socket``: it never waits behind a flush, which on
    a transport whose sends wait for the peer to receive (gloo, NCCL) may last until that peer's
    receiving thread is free; a receiving thread that sends only such headers cannot close a
    cycle of waits between two processes."""

    def __init__(self, socket: zmq.Socket, transport: Any, peer: int = 0):
        self.socket = socket
        self.transport = transport
        self.peer = peer  # rank of the process at the other end (0: the runtime)
        self._socket = threading.Lock()
        self._order = threading.Lock()

    def send(self, header: dict[str, Any], frames: list[Any] = ()) -> None:
        with self._socket:
            self.socket.send_multipart([framing.pack_header(header), *frames], copy=False)

    def send_message(self, op: str, message: Message) -> None:
        """Frame the payload first: a payload that cannot travel raises ``FramingError`` here."""
        header = {
            "op": op,
            "rid": message.request_id,
            "port": message.port,
            "end": message.end,
            "seq": message.seq,
        }
        with self._order:  # frames, then what travels beside them: one order per direction
            frames = self.transport.pack(message.request_id, message.payload, self.peer)
            self.send(header, frames)
            self.transport.flush(self.peer)

    def close(self) -> None:
        with self._socket:
            self.socket.close(linger=0)


def receive(
    socket: zmq.Socket, transport: Any, timeout_ms: int, peer: int = 0
) -> tuple[dict[str, Any], Message | None] | None:
    """The next control message within ``timeout_ms``, or None. A payload is always unpacked
    (shared memory is consumed even when the request is already gone); one that cannot be
    comes back as ``(header, None)`` with ``header["unpack_error"]``."""
    if not socket.poll(timeout_ms):
        return None
    frames = socket.recv_multipart(copy=False)
    header = framing.unpack_header(frames[0].buffer)
    if header.get("op") not in ("msg", "emit"):
        return header, None
    try:
        payload = transport.unpack(frames[1:], peer)
    except framing.FramingError as exc:
        header["unpack_error"] = str(exc)
        return header, None
    message = Message(
        str(header["rid"]), str(header["port"]), payload, bool(header["end"]), int(header["seq"])
    )
    return header, message
