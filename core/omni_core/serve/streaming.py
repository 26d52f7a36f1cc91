"""Helpers shared by the task routes: reading a request's events while watching for the client
to leave, and turning a stage failure into an HTTP error."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.requests import ClientDisconnect

from omni_core.pipeline import ClusterLost, DeadlineExceeded, OutputEvent, RequestFailed, StageUnavailable
from omni_core.serve.deadline import deadline_exceeded
from omni_core.serve.errors import APIError, StreamCut


class RequestAborted(Exception):
    """The request was aborted while its reply streamed (the server is draining)."""


log = logging.getLogger("omni.serve")


class ClientGone(Exception):
    """The client disconnected before the reply was ready; the request was aborted."""


def cluster_lost(reason: str) -> APIError:
    return APIError(503, reason, type="server_error", code="cluster_lost")


def stage_failure(exc: RequestFailed) -> APIError:
    if isinstance(exc, DeadlineExceeded):
        return deadline_exceeded()
    if isinstance(exc, ClusterLost):  # the server ends: a client retries on another one
        return cluster_lost(exc.message)
    if isinstance(exc, StageUnavailable):  # its process died: the same request succeeds once it is back
        seconds = max(1, math.ceil(exc.retry_after))
        return APIError(
            503,
            f"{exc}; retry in {seconds} s",
            type="server_error",
            code="stage_restarting",
            headers={"Retry-After": str(seconds)},
        )
    # a stage that rejects the request's content raises an exception named InvalidInput: a 400,
    # or InputTooLarge (well formed, but more than the model holds): a 413
    if exc.message.startswith("InputTooLarge:"):
        return APIError(413, str(exc), type="invalid_request_error", code="too_large")
    if exc.message.startswith("InvalidInput:"):
        return APIError(400, str(exc), type="invalid_request_error", code="invalid_input")
    return APIError(500, str(exc), type="server_error", code="stage_failed")


async def wait_for_disconnect(request: Request) -> None:
    # The body is already read, so the next receive() only returns when the client leaves.
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def unless_client_leaves(request: Request, future: asyncio.Future, timeout: float | None = None) -> bool:
    """Waits for ``future`` or for the client to disconnect, whichever comes first, for at most
    ``timeout`` seconds: True when the future is done. Cancelling the wait leaves ``future`` to
    the caller."""
    watcher = asyncio.ensure_future(wait_for_disconnect(request))
    try:
        done, _ = await asyncio.wait({future, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    return future in done


async def _until_client_leaves(request: Request, handle, work: asyncio.Future):
    """``work``'s result, reading ``handle``'s events; the request is aborted (every stage) if
    the client disconnects first (``ClientGone``) or the wait is cancelled."""
    try:
        finished = await unless_client_leaves(request, work)
    except asyncio.CancelledError:
        work.cancel()
        handle.abort()
        raise
    if not finished:
        work.cancel()
        handle.abort()
        raise ClientGone()
    return work.result()


async def collect(request: Request, handle) -> list[OutputEvent]:
    """Every event of the request; aborts it (every stage) if the client disconnects first."""

    async def consume() -> list[OutputEvent]:
        return [event async for event in handle]

    try:
        events = await _until_client_leaves(request, handle, asyncio.ensure_future(consume()))
    except RequestFailed as exc:
        raise stage_failure(exc) from None
    if handle.aborted:  # cut short by a drain: a partial reply must not look complete
        raise drained()
    return events


async def events_with_first(request: Request, handle) -> tuple[OutputEvent | None, AsyncIterator[OutputEvent]]:
    """Waits for the first event so that a request failing at once still gets a JSON error
    (before any streamed byte); returns it and an iterator over the rest. Aborts the request
    if the client disconnects first (``ClientGone``), as ``collect`` does."""
    iterator = handle.__aiter__()
    try:
        first = await _until_client_leaves(request, handle, asyncio.ensure_future(iterator.__anext__()))
    except StopAsyncIteration:
        first = None
    except RequestFailed as exc:
        raise stage_failure(exc) from None
    return first, iterator


async def all_events(first: OutputEvent | None, rest: AsyncIterator[OutputEvent], handle):
    """The request's events, starting with the one already read; raises ``RequestAborted``
    at the end if the request was aborted rather than finished."""
    if first is not None:
        yield first
    async for event in rest:
        yield event
    if handle.aborted:
        raise RequestAborted()


class SlotStreamingResponse(StreamingResponse):
    """A stream that gives its admission slot back (and aborts its request if unfinished)
    however the response ends, even when the client leaves before the first byte. A client that
    leaves is a normal end: one line at info; a ``StreamCut`` is one line at its level."""

    def __init__(self, content, slot, **kwargs):
        super().__init__(content, **kwargs)
        self.slot = slot

    async def __call__(self, scope, receive, send):
        sent, finished = 0, False

        async def watched(message):
            nonlocal sent, finished
            await send(message)
            if message["type"] == "http.response.body":
                sent += len(message.get("body", b""))
                finished = not message.get("more_body", False)

        request_id = getattr(self.slot.handle, "request_id", None)
        try:
            await super().__call__(scope, receive, watched)
        except StreamCut as exc:
            log.log(exc.level, "%s: stream of request %s cut after %d bytes: %s", self.slot.endpoint, request_id, sent, exc)
            raise
        except (ClientDisconnect, OSError):  # how a server of ASGI spec 2.4 says the client left
            pass
        finally:
            await self.slot.release()
        if not finished:  # the stream was cancelled: the client left
            log.info("%s: the client left after %d bytes; request %s aborted", self.slot.endpoint, sent, request_id)


def drained() -> APIError:
    """The error of a request a drain (the server shutting down) cut short."""
    return APIError(503, "request aborted: the server is shutting down", type="server_error", code="aborted")


def error_event(exc: Exception) -> dict:
    """The SSE error event of a stream that cannot finish."""
    if isinstance(exc, RequestAborted):
        error = drained()
        message, kind, code = error.message, error.type, error.code
    elif isinstance(exc, RequestFailed):  # as the same failure before the stream began
        error = stage_failure(exc)
        message, kind, code = error.message, error.type, error.code
    else:
        message, kind, code = str(exc), "server_error", "stage_failed"
    return {
        "type": "error",
        "error": {"message": message, "type": kind, "param": None, "code": code},
    }
