"""Connection limits the HTTP server enforces below the app, where the app cannot: a request must
arrive whole (headers and body) within ``receive_timeout_s`` of the connection opening or of the
previous response, else the connection is dropped, with a 408 when part of a request came; and
at most ``max_connections`` are open at once: past it, a new one gets a 503 and is closed.

Without them, a client that sends half a request and waits holds a connection (and its buffers)
for ever, and enough of them exhaust the process's file descriptors.
"""

from __future__ import annotations

import json

from uvicorn.protocols.http.h11_impl import H11Protocol

REFUSED_LINGER_S = 1.0  # a refused connection's time to read its answer and close


def _response(status: str, message: str, code: str) -> bytes:
    """A whole HTTP/1.1 response in OpenAI's error shape, written before the connection closes."""
    kind = "server_error" if status.startswith("5") else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": kind, "param": None, "code": code}}).encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode() + body


def limited_protocol(receive_timeout_s: float, max_connections: int) -> type[H11Protocol]:
    """uvicorn's HTTP/1.1 protocol (h11) with those limits; given to uvicorn as ``http=``."""
    too_slow = _response(
        "408 Request Timeout", f"the request did not arrive whole within {receive_timeout_s:g} s", "request_timeout"
    )
    too_many = _response(
        "503 Service Unavailable", f"the server has {max_connections} connections open; retry later", "too_many_connections"
    )

    class LimitedH11Protocol(H11Protocol):
        _deadline = None
        _refused = False

        def connection_made(self, transport) -> None:
            if len(self.connections) >= max_connections:
                # answered and half-closed; what the client sends is read and dropped until it
                # closes (closing on unread bytes would reset the connection, losing the answer)
                self._refused = True
                self.transport = transport
                transport.write(too_many)
                transport.write_eof()
                self.loop.call_later(REFUSED_LINGER_S, transport.close)
                return
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def eof_received(self):
            if self._refused:
                self.transport.close()
            return super().eof_received()

        def connection_lost(self, exc) -> None:
            if self._refused:
                return
            self._disarm()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self._received_whole():
                self._disarm()

        def handle_websocket_upgrade(self, event) -> None:
            # the connection is the WebSocket protocol's from here (with its own idle timeout):
            # this timer would otherwise close it mid-session
            self._disarm()
            super().handle_websocket_upgrade(event)

        def on_response_complete(self) -> None:
            self._arm()  # for the next request (a pipelined one may arrive whole right away)
            super().on_response_complete()

        def _received_whole(self) -> bool:
            cycle = self.cycle
            return cycle is not None and not cycle.response_complete and not cycle.more_body

        def _arm(self) -> None:
            self._disarm()
            self._deadline = self.loop.call_later(receive_timeout_s, self._timed_out)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _timed_out(self) -> None:
            self._deadline = None
            cycle = self.cycle
            between = cycle is None or cycle.response_complete  # no request under way
            if self.transport.is_closing() or self._received_whole() or (not between and cycle.response_started):
                return  # nothing to wait for, or the app has answered already
            if not between or self.conn.trailing_data[0]:  # part of a request came: say why it ends
                self.transport.write(too_slow)
            self.transport.close()  # the app, if it waits for the body, sees the client leave

    return LimitedH11Protocol
