"""What one server holds: the ``Omni`` runtime (``None`` while it loads), admission, metrics, the
requests in flight, and the drain that SIGTERM starts."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from omni_core.pipeline import DeadlineExceeded
from omni_core.serve.admission import Admission, draining_error
from omni_core.serve.deadline import HEADER, deadline_exceeded, request_timeout
from omni_core.serve.errors import APIError, unknown_model
from omni_core.serve.metrics import ServerMetrics
from omni_core.serve.streaming import ClientGone, cluster_lost, unless_client_leaves
from omni_core.surface.inputs import Limits


@dataclass
class ServeConfig:
    family: str
    served_model_name: str
    api_key: str | None = None
    max_running: int = 16
    max_queued: int = 64
    limits: Limits = field(default_factory=Limits)
    drain_grace_s: float = 30.0
    public_docs: bool = False  # /openapi.json, /docs, /redoc without the API key
    metrics_require_key: bool = False  # /metrics behind the API key too
    request_timeout_s: float | None = 600.0  # the longest a request may run (None: no limit)
    socket_idle_timeout_s: float | None = 60.0  # a WebSocket with no message and no work for this long closes


class Slot:
    """A running slot taken from admission; released once, however the request ends.
    ``deadline`` (``time.monotonic()``, None: none) is the request's, to submit it with."""

    def __init__(self, state: ServerState, endpoint: str, deadline: float | None = None):
        self.state = state
        self.endpoint = endpoint
        self.deadline = deadline
        self.started = time.perf_counter()
        self.handle: Any = None
        self._released = False

    def track(self, handle: Any) -> Any:
        self.handle = handle
        self.state.in_flight.add(handle)
        return handle

    async def release(self) -> None:
        if self._released:
            return
        self._released = True
        if self.handle is not None:
            self.state.in_flight.discard(self.handle)
            if not self.handle.done:  # the response ended early (client gone, error): free every stage
                self.handle.abort()
            # before aborted: a segmented request whose part ran out of time aborts its other parts
            if isinstance(self.handle.error, DeadlineExceeded):
                self.state.metrics.timed_out.labels(self.endpoint).inc()
            elif self.handle.aborted:
                self.state.metrics.aborted.labels(self.endpoint).inc()
        await self.state.admission.release(time.perf_counter() - self.started)


class ServerState:
    def __init__(self, config: ServeConfig):
        self.config = config
        self.omni: Any = None
        self.load_error: str | None = None
        self.fatal_error: str | None = None  # why a server that served can serve no more (it exits)
        self.created = int(time.time())
        self.admission = Admission(config.max_running, config.max_queued)
        self.metrics = ServerMetrics(self.admission, self._runtime_stats)
        self.in_flight: set[Any] = set()

    def _runtime_stats(self) -> dict:
        return self.omni.stats() if self.omni is not None else {}

    @property
    def status(self) -> str:
        if self.admission.draining:
            return "draining"
        if self.load_error or self.fatal_error:
            return "failed"
        if self.omni is not None and self.omni.unavailable:
            return "unavailable"
        return "ready" if self.omni is not None else "loading"

    @property
    def error(self) -> str | None:
        """Why the server is not ready, when something failed (/health shows it)."""
        problem = self.omni.unavailable if self.omni is not None else None
        return self.load_error or self.fatal_error or problem

    def check_model(self, name: str | None) -> None:
        if not name:
            raise APIError(400, "model is required", param="model", code="missing_required_parameter")
        if name != self.config.served_model_name:
            raise unknown_model(name, self.config.served_model_name)

    def ready_omni(self):
        if self.admission.draining:
            raise draining_error()
        if self.omni is None:
            message = (
                f"model failed to load: {self.load_error}"
                if self.load_error
                else "the model is still loading"
            )
            raise APIError(503, message, type="server_error", code="not_ready", headers={"Retry-After": "5"})
        if self.omni.lost:
            raise cluster_lost(self.omni.lost)
        problem = self.omni.unavailable
        if problem:  # its cluster may come back (a fault-tolerant GCS restarted)
            raise APIError(
                503, problem, type="server_error", code="cluster_unreachable", headers={"Retry-After": "5"}
            )
        return self.omni

    async def admit(self, endpoint: str, request: Request) -> Slot:
        """A running slot for the request (its body already read), with the request's deadline
        counted from now; one that waits in the queue gives its place up if the client leaves
        meanwhile (``ClientGone``) or its deadline passes (504)."""
        self.ready_omni()
        timeout = request_timeout(request.headers.get(HEADER), self.config.request_timeout_s)
        deadline = time.monotonic() + timeout if timeout is not None else None
        acquiring = asyncio.ensure_future(self.admission.acquire())
        try:
            admitted = await unless_client_leaves(request, acquiring, timeout)
        except asyncio.CancelledError:
            await self._give_up(acquiring, endpoint, self.metrics.aborted)
            raise
        if not admitted:
            if deadline is not None and time.monotonic() >= deadline:
                await self._give_up(acquiring, endpoint, self.metrics.timed_out)
                raise deadline_exceeded()
            await self._give_up(acquiring, endpoint, self.metrics.aborted)
            raise ClientGone()
        acquiring.result()  # 429, 503
        return Slot(self, endpoint, deadline)

    async def _give_up(self, acquiring: asyncio.Future, endpoint: str, counter) -> None:
        """Leaves the queue (an aborted or timed-out request, as one that left a stage: counted in
        ``counter``); a slot granted in the meantime goes back, and a wake-up this waiter may have
        taken is passed on."""
        counter.labels(endpoint).inc()
        acquiring.cancel()
        try:
            await acquiring
        except (asyncio.CancelledError, APIError):
            await self.admission.wake_one()
        else:
            await self.admission.release()

    async def drain(self, grace_s: float) -> int:
        """Refuse new work, give admitted requests ``grace_s`` to finish, abort the rest.
        Returns how many were aborted."""
        await self.admission.start_draining()
        deadline = time.monotonic() + grace_s
        while (self.admission.running or self.admission.queued) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        left = [handle for handle in self.in_flight if not handle.done]
        for handle in left:
            handle.abort()  # their streams end; each Slot counts its abort when it releases
        return len(left)
