"""The control plane between the runtime and a stage process: zmq PUSH/PULL pairs carrying
multipart messages ``[msgpack header, *transport frames]``.

Header ``op``s, runtime -> stage: ``msg`` (rid, port, end, seq + a payload), ``abort`` and
``release`` (rid), ``stop``. Stage -> runtime: ``ready``, ``error`` (startup failed: message),
``emit`` (rid, port, end, seq + a payload), ``fail`` (rid, error), ``stats`` (the executor's).
"""

from __future__ import annotations

import threading
import time
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


SEND_POLL_MS = 50  # how often a send that waits for room checks whether its channel was closed


class ChannelClosed(ConnectionError):
    """A send gave up: the channel was closed (its process died or the stage stopped) or no peer
    took the message in time."""


class Channel:
    """One direction of the control plane. Two locks: ``_socket`` around each use of the zmq
    socket (not thread-safe), and ``_order`` around a payload's framing, header and transport
    flush, so headers go out in the order their tensors are sent. A header without a payload
    (stats, abort, release, fail) takes only ``_socket``: it never waits behind a flush, which on
    a transport whose sends wait for the peer to receive (gloo, NCCL) may last until that peer's
    receiving thread is free; a receiving thread that sends only such headers cannot close a
    cycle of waits between two processes.

    A PUSH socket whose peer is gone holds a send forever, and with it ``_socket``; so sends wait
    for room in steps, and ``close`` (marked before it takes the lock) ends a waiting send with
    ``ChannelClosed``: a dead stage process costs the threads sending to it nothing but that
    error, and its restart can close the channel."""

    def __init__(self, socket: zmq.Socket, transport: Any, peer: int = 0):
        self.socket = socket
        self.transport = transport
        self.peer = peer  # rank of the process at the other end (0: the runtime)
        self._socket = threading.Lock()
        self._order = threading.Lock()
        self._closed = False

    def send(self, header: dict[str, Any], frames: list[Any] = (), timeout_s: float | None = None) -> None:
        """Send once the peer has room; ``ChannelClosed`` if the channel is closed meanwhile or
        ``timeout_s`` passes first."""
        parts = [framing.pack_header(header), *frames]
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._socket:
            while True:
                if self._closed:
                    raise ChannelClosed("the channel to the stage process is closed")
                try:
                    self.socket.send_multipart(parts, flags=zmq.NOBLOCK, copy=False)
                    return
                except zmq.Again:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise ChannelClosed(f"the stage process took no message for {timeout_s:g} s") from None
                    self.socket.poll(SEND_POLL_MS, zmq.POLLOUT)

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
        """Close the socket; a send waiting for room ends with ``ChannelClosed`` first."""
        self._closed = True
        with self._socket:
            if not self.socket.closed:
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
