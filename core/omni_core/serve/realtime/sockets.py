"""What every WebSocket endpoint shares: the API key (as the HTTP API takes it, or in OpenAI's
subprotocol form), one admission slot held while the socket is open, the requests it runs
(aborted in every stage when it closes), an idle timeout, and error events in OpenAI's shape.

A socket counts as one running request for admission (``--max-running``, ``--max-queued``):
its turns or sentences run one at a time inside it, so the limits still bound the work the
pipeline sees. A refused handshake is answered with the HTTP API's own error (401, 429, 503).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from fastapi import WebSocket
from starlette.websockets import WebSocketDisconnect, WebSocketState

from omni_core.pipeline import RequestFailed
from omni_core.serve.auth import offered_key
from omni_core.serve.errors import APIError, from_invalid_input
from omni_core.serve.exceptions import InvalidInput
from omni_core.serve.state import ServerState, Slot
from omni_core.serve.streaming import stage_failure

log = logging.getLogger("omni.serve")

MAX_MESSAGE_BYTES = 16 * 2**20  # a text frame is parsed whole: a bound on one message
QUEUE_WAIT_S = 30.0  # the longest a handshake waits in the admission queue
DRAIN_POLL_S = 0.5  # how often a waiting socket looks whether the server drains


class SocketClosed(Exception):
    """The client closed the socket (or it was closed for it)."""


# what fails one request of a socket's: told to the client, and the socket stays open
REQUEST_ERRORS = (APIError, InvalidInput, RequestFailed)


def error_event(
    message: str,
    code: str,
    *,
    param: str | None = None,
    kind: str = "invalid_request_error",
    event_id: str | None = None,
) -> dict:
    return {
        "type": "error",
        "event_id": new_id("event"),
        "error": {"type": kind, "code": code, "message": message, "param": param, "event_id": event_id},
    }


def error_event_of(exc: Exception, event_id: str | None = None) -> dict:
    """The error event of a refused message or a failed request (as the HTTP API would answer)."""
    if isinstance(exc, InvalidInput):
        exc = from_invalid_input(exc)
    elif isinstance(exc, RequestFailed):
        exc = stage_failure(exc)
    if isinstance(exc, APIError):
        return error_event(
            exc.message, exc.code or "invalid_request", param=exc.param, kind=exc.type, event_id=event_id
        )
    return error_event(f"{type(exc).__name__}: {exc}", "server_error", kind="server_error", event_id=event_id)


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class Socket:
    """An accepted WebSocket with its admission slot: ``open`` accepts it (or answers the
    handshake with the HTTP error), ``receive_json`` waits for the next client message within the
    idle timeout, ``send`` writes an event, ``track`` registers a request to abort on close, and
    ``close`` frees everything (once, however the socket ends)."""

    def __init__(self, websocket: WebSocket, state: ServerState, endpoint: str):
        self.websocket = websocket
        self.state = state
        self.endpoint = endpoint
        self.slot: Slot | None = None
        self.handles: set[Any] = set()
        self.idle_s = state.config.socket_idle_timeout_s
        self._last_activity = time.monotonic()
        self._send_lock = asyncio.Lock()

    async def open(self, check=None) -> bool:
        """Runs ``check()`` (the endpoint's own checks of the handshake, past AuthMiddleware's of
        the key and origin: it raises ``APIError``) and takes an admission slot, then accepts;
        False (the handshake refused with the HTTP API's error) when either fails."""
        _, protocols = offered_key(self.websocket)  # the key and origin passed AuthMiddleware
        try:
            if check is not None:
                check()
            self.slot = await self._admit()
        except APIError as exc:
            await self.websocket.send_denial_response(exc.response())
            return False
        # a client that offered protocols expects one chosen (OpenAI's browser form offers "realtime")
        try:
            await self.websocket.accept(subprotocol=protocols[0] if protocols else None)
        except BaseException as exc:  # the client left while it waited for a slot: the slot goes back
            await self.close()
            if isinstance(exc, Exception):
                return False
            raise
        self.state.metrics.requests.labels(self.endpoint, "101").inc()
        return True

    async def _admit(self) -> Slot:
        self.state.ready_omni()
        acquiring = asyncio.ensure_future(self.state.admission.acquire())
        try:
            await asyncio.wait_for(asyncio.shield(acquiring), QUEUE_WAIT_S)
        except TimeoutError:
            await self.state._give_up(acquiring, self.endpoint, self.state.metrics.timed_out)
            raise APIError(
                503,
                "the server is busy: no session slot came free",
                type="server_error",
                code="server_busy",
                headers={"Retry-After": "5"},
            ) from None
        except asyncio.CancelledError:
            await self.state._give_up(acquiring, self.endpoint, self.state.metrics.aborted)
            raise
        return Slot(self.state, self.endpoint)

    def deadline(self) -> float | None:
        """The deadline of one request the socket runs (a sentence, a turn): ``--request-timeout``
        from now, as an HTTP request's (None: the server sets none)."""
        timeout = self.state.config.request_timeout_s
        return None if timeout is None else time.monotonic() + timeout

    def track(self, handle: Any) -> Any:
        self.handles.add(handle)
        self.state.in_flight.add(handle)
        return handle

    async def run_request(self, omni, make_inputs, on_event, *, wanted=lambda: True, on_submit=None):
        """Runs one request of the socket's (a sentence, a turn, a response): ``make_inputs()`` on
        a worker thread, submitted to ``omni`` with the socket's deadline, ``on_submit(handle)``
        and then ``on_event(event)`` for each of its events. Returns the handle once they end
        (``handle.aborted``: stopped from outside), or None when ``wanted()`` turned false before
        it was submitted. However it ends, the request is forgotten (aborted if it still runs);
        what fails it (``REQUEST_ERRORS``) is the caller's to tell."""
        if not wanted():
            return None
        inputs = await asyncio.to_thread(make_inputs)
        if not wanted():
            return None
        handle = self.track(omni.submit(inputs, deadline=self.deadline()))
        try:
            if on_submit is not None:
                await on_submit(handle)
            async for event in handle:
                await on_event(event)
        finally:
            self.done_with(handle)
        return handle

    def done_with(self, handle: Any) -> None:
        """Forgets a request that ended; one that did not is aborted in every stage."""
        self.handles.discard(handle)
        self.state.in_flight.discard(handle)
        if not handle.done:
            handle.abort()
            self.state.metrics.aborted.labels(self.endpoint).inc()
        self.touch()

    def touch(self) -> None:
        self._last_activity = time.monotonic()

    async def receive_json(self, busy=lambda: False) -> tuple[dict | None, str | None]:
        """The next client message as (event, None), or (None, why it is refused) for a message
        that is not a JSON object. Raises ``SocketClosed`` when the client leaves, after
        ``idle_s`` with no message while ``busy()`` is false, or once the server drains and
        nothing of the socket runs (the client is told first, in an error event)."""
        while True:
            waited = time.monotonic() - self._last_activity
            wait = DRAIN_POLL_S if not self.idle_s else min(DRAIN_POLL_S, max(self.idle_s - waited, 0.01))
            try:
                message = await asyncio.wait_for(self.websocket.receive(), timeout=wait)
            except TimeoutError:
                if busy():
                    self.touch()
                elif self.state.admission.draining:
                    # the drain waits for admission slots: an idle socket must not hold it
                    await self._end_with(
                        "the server is shutting down: the socket is closed", "draining", 1001
                    )
                elif self.idle_s and time.monotonic() - self._last_activity >= self.idle_s:
                    await self._end_with(
                        f"no message for {self.idle_s:g} s: the socket is closed", "idle_timeout", 1000
                    )
                continue
            if message["type"] == "websocket.disconnect":
                raise SocketClosed()
            self.touch()
            text = message.get("text")
            if text is None:
                return None, "send events as JSON text frames, not binary frames"
            if len(text) > MAX_MESSAGE_BYTES:
                return None, f"a message may be at most {MAX_MESSAGE_BYTES} bytes"
            try:
                event = json.loads(text)
            except ValueError as exc:
                return None, f"the message is not JSON: {exc}"
            if not isinstance(event, dict):
                return None, "an event is a JSON object with a 'type'"
            return event, None

    async def _end_with(self, message: str, code: str, close_code: int) -> None:
        kind = "server_error" if code == "draining" else "timeout_error"
        await self.send(error_event(message, code, kind=kind))
        await self._close_socket(close_code, code)
        raise SocketClosed()

    async def send(self, event: dict | bytes) -> None:
        """Writes an event (a dict as JSON text, bytes as a binary frame); ``SocketClosed`` when
        the client has gone."""
        if self.websocket.application_state != WebSocketState.CONNECTED:
            raise SocketClosed()
        async with self._send_lock:
            try:
                if isinstance(event, bytes):
                    await self.websocket.send_bytes(event)
                else:
                    await self.websocket.send_text(json.dumps(event))
            except (WebSocketDisconnect, RuntimeError, OSError):
                raise SocketClosed() from None

    async def _close_socket(self, code: int, reason: str) -> None:
        if self.websocket.application_state == WebSocketState.CONNECTED:
            try:
                await self.websocket.close(code, reason)
            except (WebSocketDisconnect, RuntimeError, OSError):  # the client has closed it already
                pass

    async def close(self, code: int = 1000, reason: str = "") -> None:
        """Aborts every request still running, gives the slot back and closes the socket."""
        for handle in list(self.handles):
            self.done_with(handle)
        if self.slot is not None:
            slot, self.slot = self.slot, None
            await slot.release()
        await self._close_socket(code, reason)


async def run_until_closed(socket: Socket, endpoint: str, *jobs) -> None:
    """Run a socket's coroutines (its receiver and its worker) until the first ends; an error
    other than the socket closing is told to the client as an error event. Then the rest are
    cancelled and the socket closed (its requests aborted, its slot given back)."""
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                error = task.exception()
                if not isinstance(error, SocketClosed):
                    log.warning("%s: the socket failed: %r", endpoint, error)
                    await socket.send(error_event_of(error))
    except SocketClosed:
        pass
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await socket.close()
