"""The pipeline runtime: places stages, routes their messages along edges, tracks requests.

Every stage runs an executor on its own thread(s). A stage placed in a process is represented
here by a ``ProcessStage`` (an executor that forwards over zmq to a child running the same
executor code), so routing is one code path for every placement. Emits are routed on the
emitting thread: terminal events go to the request's handle, messages to the next executors.
"""

from __future__ import annotations

import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

from omni_core.pipeline.deadlines import DeadlineWatch
from omni_core.pipeline.handle import (
    ClusterLost,
    DeadlineExceeded,
    OutputEvent,
    RequestFailed,
    RequestHandle,
    StageUnavailable,
)
from omni_core.pipeline.routing import RequestPlan, Routes
from omni_core.pipeline.stage_host import build_executor, release_request
from omni_core.pipeline.topology import Topology, TopologyError
from omni_core.pipeline.validation import validate_topology
from omni_core.scheduler.executor import Executor, Message

PLACEMENTS = ("inproc", "process", "ray")
OWN_PROCESS = ("process", "ray")  # placements whose stage runs in a process of its own


def check_picklable(rebuild: Callable[[], Topology]) -> None:
    """A stage process rebuilds the topology with ``rebuild``, sent to it pickled: say so now, and
    which object, rather than when the first stage process is spawned."""
    import pickle

    try:
        pickle.dumps(rebuild)
    except Exception as exc:  # pickle raises several types: PicklingError, AttributeError, TypeError
        raise ValueError(
            f"stages placed in processes rebuild the topology there, so the family's build must be "
            f"picklable (a module-level function, not a lambda or a local one): {exc}"
        ) from None


class PipelineFull(RuntimeError):
    """``max_running`` requests are in flight; retry later."""


class _Request:
    __slots__ = ("deadline", "handle", "plan")

    def __init__(self, handle: RequestHandle, plan: RequestPlan, deadline: float | None):
        self.handle = handle
        self.plan = plan
        self.deadline = deadline


class Pipeline:
    """Runs a ``Topology``. See docs/runtime.md for placement, transports, faults and limits."""

    def __init__(
        self,
        topology: Topology,
        *,
        stage_mode: str = "inproc",
        placement: dict[str, str] | None = None,
        transport: str = "shm",
        device: str = "cpu",
        plugin_manager: Any = None,
        rebuild: Callable[[], Topology] | None = None,
        control: str = "ipc",
        max_running: int = 1024,
        transport_options: dict[str, Any] | None = None,
        ray: Any = None,
    ):
        validate_topology(topology)
        if plugin_manager is None:
            from omni_core.hooks import get_plugin_manager

            plugin_manager = get_plugin_manager()
        self.topology = topology
        self.plugin_manager = plugin_manager
        self.device = device
        self.transport_name = transport
        self.transport_options = dict(transport_options or {})
        self.control = control
        self.rebuild = rebuild
        self.max_running = max_running
        self.routes = Routes(topology)
        self.placement = self._resolve_placement(stage_mode, placement or {})
        if any(p in OWN_PROCESS for p in self.placement.values()):
            self._check_process_placement()
        self.ray_options = ray  # a RayOptions for stages placed on Ray (None: its defaults)
        self._ray = None  # the RayPlacement, once started
        self.prefix = f"omni-{uuid.uuid4().hex[:10]}"  # names this pipeline's shm segments and sockets
        self.executors: dict[str, Executor] = {}
        self._requests: dict[str, _Request] = {}
        self._lock = threading.Lock()
        self._started = False
        self._closed = False
        self._transport = None
        self._deadlines = DeadlineWatch(self._expire, name=f"{self.prefix}-deadlines")

    # -- configuration ----------------------------------------------------------------------------

    def _resolve_placement(self, stage_mode: str, placement: dict[str, str]) -> dict[str, str]:
        if stage_mode not in PLACEMENTS:
            raise ValueError(f"stage_mode must be one of {list(PLACEMENTS)}, got {stage_mode!r}")
        names = [s.name for s in self.topology.stages]
        for stage, where in placement.items():
            if stage not in names:
                raise TopologyError(f"placement names unknown stage {stage!r}; stages: {names}")
            if where not in PLACEMENTS:
                raise ValueError(f"placement of {stage!r} must be one of {list(PLACEMENTS)}, got {where!r}")
        return {name: placement.get(name, stage_mode) for name in names}

    def _check_process_placement(self) -> None:
        if self.rebuild is None:
            raise ValueError(
                "stages placed in processes or on Ray need rebuild=: a picklable callable returning the topology"
            )
        check_picklable(self.rebuild)
        spec = self.plugin_manager.transport(self.transport_name)
        if not spec.cross_process:
            raise ValueError(
                f"transport {self.transport_name!r} cannot cross processes; use one of "
                f"{sorted(n for n, s in self.plugin_manager.transports().items() if s.cross_process)}"
            )

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self, progress: Callable[[str], None] | None = None) -> Pipeline:
        """Place and start every stage; ``progress`` hears of each stage as it becomes ready."""
        if self._started:
            return self
        if self._closed:
            raise RuntimeError("pipeline was shut down")
        # each stage in a process of its own is a peer of the transport, ranked in stage order
        peers = [s.name for s in self.topology.stages if self.placement[s.name] in OWN_PROCESS]
        peer_of = {name: rank for rank, name in enumerate(peers, start=1)}
        try:
            if any(p == "ray" for p in self.placement.values()):
                self._place_on_ray()
            if peers:
                self._transport = self._make_transport(peer_of)
                # also at interpreter exit, should shutdown() never be called
                weakref.finalize(self, self._transport.close)
            for stage in self.topology.stages:
                device = stage.device or self.device
                emit, fail = self._callbacks(stage.name)
                if self.placement[stage.name] == "process":
                    from omni_core.pipeline.process_stage import ProcessStage

                    executor: Executor = ProcessStage(self, stage, device, emit, fail, peer=peer_of[stage.name])
                elif self.placement[stage.name] == "ray":
                    from omni_core.pipeline.ray_stage import RayStage

                    executor = RayStage(
                        self, stage, device, emit, fail, peer_of[stage.name], self._ray,
                        self._stage_transport(stage.name),
                    )
                else:
                    executor = build_executor(
                        stage, device=device, emit=emit, fail=fail, plugin_manager=self.plugin_manager,
                        family=self.topology.name,
                    )
                self.executors[stage.name] = executor
            self._start_all(progress)
        except BaseException:
            self.shutdown()
            raise
        self._started = True
        return self

    def _make_transport(self, peer_of: dict[str, int]):
        spec = self.plugin_manager.transport(self.transport_name)
        options = {**self.transport_options, "prefix": self.prefix, "peers": len(peer_of), "device": self.device}
        remote = [name for name in peer_of if self._ray is not None and self._off_node(name)]
        if self._ray is not None and spec.cross_host:
            options.setdefault("host", self._ray.runtime_address)  # a rendezvous other nodes reach (nccl)
        if not remote or spec.cross_host:
            return spec.factory(options)
        from omni_core.comm.per_peer import PeerTransports

        remote_spec = self._remote_transport_spec(remote[0])
        far = remote_spec.factory({"prefix": self.prefix, "peers": len(peer_of), "device": self.device})
        return PeerTransports({peer_of[name]: far for name in remote}, spec.factory(options))

    # -- placement on Ray -------------------------------------------------------------------------

    def _place_on_ray(self) -> None:
        from omni_core.pipeline.ray_placement import RayOptions, RayPlacement

        self._ray = RayPlacement(self.ray_options or RayOptions())
        stages = {s.name: s.device or self.device for s in self.topology.stages if self.placement[s.name] == "ray"}
        self._ray.place(stages)
        self._ray.watch(self._cluster_lost)

    def _cluster_lost(self, reason: str) -> None:
        """The Ray cluster is gone: every running request fails now, naming it (no stage on it can
        finish or be restarted); ``submit`` refuses new ones."""
        for request in self._take_running():
            self._deadlines.discard(request.handle.request_id, request.deadline)
            request.handle._close(ClusterLost(reason))
            self._drop(request.handle.request_id, request.plan, abort=True)  # frees what lives on

    def _take_running(self) -> list:
        """Every running request, no longer the pipeline's (the caller ends them)."""
        with self._lock:
            running = list(self._requests.values())
            self._requests.clear()
        return running

    @property
    def unavailable(self) -> str | None:
        """Why the pipeline cannot serve now (its Ray cluster unreachable or lost); None: it can."""
        return self._ray.problem() if self._ray is not None else None

    @property
    def lost(self) -> str | None:
        """Why the pipeline can never serve again (its Ray cluster lost); None: it can."""
        return self._ray.lost if self._ray is not None else None

    def _off_node(self, stage: str) -> bool:
        return self.placement[stage] == "ray" and not self._ray.same_node(stage)

    def _remote_transport_spec(self, stage: str):
        """The transport to stages on other nodes; one that cannot cross hosts fails the start."""
        from omni_core.pipeline.ray_placement import RayPlacementError

        name = self._ray.options.remote_transport
        spec = self.plugin_manager.transport(name)
        if not spec.cross_host:
            crossing = sorted(n for n, s in self.plugin_manager.transports().items() if s.cross_host)
            raise RayPlacementError(
                f"stage {stage!r} was placed on node {self._ray.nodes[stage][:8]}, not the runtime's "
                f"({self._ray.runtime_node[:8]}), and transport {name!r} cannot cross hosts; use one of {crossing}"
            )
        return spec

    def _stage_transport(self, stage: str) -> str:
        """The transport's name between the runtime and a stage's process."""
        if self._off_node(stage) and not self.plugin_manager.transport(self.transport_name).cross_host:
            return self._ray.options.remote_transport
        return self.transport_name

    def _start_all(self, progress: Callable[[str], None] | None = None) -> None:
        """Start every executor; process stages spawn concurrently (each pays the interpreter start)."""
        errors: dict[str, BaseException] = {}
        ready: list[str] = []
        counted = threading.Lock()

        def start_one(name: str, executor: Executor) -> None:
            began = time.monotonic()
            try:
                executor.start()
            except BaseException as exc:
                errors[name] = exc
                return
            if progress is not None:
                with counted:
                    ready.append(name)
                    progress(f"stage {name!r} ready in {time.monotonic() - began:.1f} s ({len(ready)} of {len(self.executors)})")

        threads = [
            threading.Thread(target=start_one, args=(n, e), daemon=True) for n, e in self.executors.items()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            name, exc = next(iter(errors.items()))
            raise RuntimeError(f"stage {name!r} failed to start: {exc}") from exc

    def shutdown(self) -> None:
        """Stop executors and stage processes, fail what is still running, free shared memory."""
        if self._closed:
            return
        self._closed = True
        running = self._take_running()
        self._deadlines.close()
        for request in running:
            request.handle._close(RequestFailed("", "pipeline shut down"))
        for executor in self.executors.values():
            try:
                executor.stop()
            except Exception:  # keep stopping the others
                pass
        if self._transport is not None:
            self._transport.close()
        if self._ray is not None:
            self._ray.remove()  # after the actors: their bundles go with the group

    def __enter__(self) -> Pipeline:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.shutdown()

    # -- requests ---------------------------------------------------------------------------------

    def submit(
        self, inputs: dict[str, Any], request_id: str | None = None, deadline: float | None = None
    ) -> RequestHandle:
        """Start a request; non-blocking. Raises ``PipelineFull`` past ``max_running``.

        ``deadline`` (a ``time.monotonic()`` value): once it passes, the request is stopped in
        every stage as an abort stops it, and its handle raises ``DeadlineExceeded`` (or
        ``StageUnavailable`` when it was waiting for a stage process being restarted)."""
        if not self._started or self._closed:
            raise RuntimeError("pipeline is not running: call start() first")
        if self._ray is not None and self._ray.lost:
            raise ClusterLost(self._ray.lost)
        if not isinstance(inputs, dict):
            raise TypeError(f"inputs must be a dict, got {type(inputs).__name__}")
        request_id = request_id or uuid.uuid4().hex
        plan = self.routes.plan(inputs)
        if not plan.expected:
            raise TopologyError("this request reaches no terminal output")
        handle = RequestHandle(request_id, self, tuple(sorted(plan.expected)))
        with self._lock:
            if request_id in self._requests:
                raise ValueError(f"request id {request_id!r} is already running")
            if len(self._requests) >= self.max_running:
                raise PipelineFull(f"{len(self._requests)} requests running (max_running={self.max_running})")
            self._requests[request_id] = _Request(handle, plan, deadline)
        if deadline is not None:  # before delivering: a full entry queue may hold the caller
            self._deadlines.add(request_id, deadline)
        self._deliver(self.routes.entry_stage, Message(request_id, self.routes.entry_port, inputs, True, 0))
        return handle

    def abort(self, request_id: str) -> None:
        """Stop the request in every stage and free its state; its handle's iteration ends."""
        with self._lock:
            request = self._requests.pop(request_id, None)
        if request is None:
            return
        self._deadlines.discard(request_id, request.deadline)
        request.handle._close(aborted=True)
        self._drop(request_id, request.plan, abort=True)

    def _expire(self, request_id: str, deadline: float) -> None:
        """The request's deadline passed: stop it in every stage, as ``abort`` does."""
        with self._lock:
            request = self._requests.get(request_id)
            if request is None or request.deadline != deadline:
                return  # ended meanwhile (or the id now names a later request)
            del self._requests[request_id]
        request.handle._close(self._restart_wait(request_id, request.plan) or DeadlineExceeded())
        self._drop(request_id, request.plan, abort=True)

    def _restart_wait(self, request_id: str, plan: RequestPlan) -> StageUnavailable | None:
        """Why the request is late when one of its messages waits for a stage process being
        restarted: that is transient, not the request's own doing."""
        for stage in plan.reached:
            # only a stage placed in a process restarts (ProcessStage); others have no such wait
            waiting = getattr(self.executors.get(stage), "restart_wait", None)
            seconds = waiting(request_id) if waiting is not None else None
            if seconds is not None:
                message = "its process died and is being restarted; the request's deadline passed while it waited"
                return StageUnavailable(stage, message, seconds)
        return None

    def _drop(self, request_id: str, plan: RequestPlan, abort: bool) -> None:
        for stage in plan.reached:
            executor = self.executors.get(stage)
            if executor is None:
                continue
            try:
                executor.abort(request_id) if abort else release_request(executor, request_id)
            except Exception:  # one stage's cleanup must not block the others'
                pass
        if self._transport is not None:
            self._transport.release(request_id)

    def _callbacks(self, stage: str):
        def emit(message: Message) -> None:
            self._route(stage, message)

        def fail(request_id: str, error: str, retry_after: float | None = None) -> None:
            self._fail(stage, request_id, error, retry_after)

        return emit, fail

    def _route(self, stage: str, message: Message) -> None:
        if message.port not in self.routes.outputs[stage]:
            self._fail(
                stage,
                message.request_id,
                f"emitted on {message.port!r}, which is not one of its "
                f"outputs {list(self.routes.outputs[stage])}",
            )
            return
        with self._lock:
            request = self._requests.get(message.request_id)
            if request is None:
                return  # finished, failed or aborted: late messages are dropped
            events, deliveries = request.plan.route(self.routes, stage, message)
            for name, msg in events:
                request.handle._push(OutputEvent(name, msg.payload, msg.end, msg.seq))
            finished = request.plan.complete
            if finished:
                del self._requests[message.request_id]
                request.handle._close()
        if finished:
            self._deadlines.discard(message.request_id, request.deadline)
            self._drop(message.request_id, request.plan, abort=False)
            return
        for dst, msg in deliveries:
            self._deliver(dst, msg)

    def _deliver(self, stage: str, message: Message) -> None:
        executor = self.executors[stage]
        executor.submit(message)  # may wait while the stage's queue is full (backpressure)
        with self._lock:
            gone = message.request_id not in self._requests
        if gone:  # aborted or failed while we waited: do not leave state behind in that stage
            executor.abort(message.request_id)

    def _fail(self, stage: str, request_id: str, error: str, retry_after: float | None = None) -> None:
        """Fails the request; with ``retry_after`` (a stage process being restarted) the failure
        is transient: ``StageUnavailable``."""
        with self._lock:
            request = self._requests.pop(request_id, None)
        if request is None:
            return
        self._deadlines.discard(request_id, request.deadline)
        failure = RequestFailed(stage, error) if retry_after is None else StageUnavailable(stage, error, retry_after)
        request.handle._close(failure)
        self._drop(request_id, request.plan, abort=True)

    # -- introspection ----------------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        with self._lock:
            running = len(self._requests)
        stages = {}
        for name, executor in self.executors.items():
            stats = dict(executor.stats())
            stats.setdefault("queue_depth", 0)
            stats["placement"] = self.placement[name]
            stages[name] = stats
        return {"running": running, "stages": stages}

    def stage_pids(self) -> dict[str, int]:
        """Process ids of the stages placed in their own processes."""
        return {name: e.pid for name, e in self.executors.items() if getattr(e, "pid", None) is not None}

    def running(self) -> list[str]:
        with self._lock:
            return list(self._requests)
