"""A stage placed on a Ray actor: the process placement with an actor for the process.

``RayStage`` is a ``ProcessStage`` whose child is a ``StageActor`` in the deployment's placement
group, running the very main loop of a stage process (``run_stage_process``) over the same
control messages; its sockets are bound on the runtime node's address, over tcp, so an actor on
another node reaches them. Everything else (routing, restarts, the requests lost with a dead
actor) is ``ProcessStage``'s. ``ActorProcess`` gives an actor the few calls of a
``multiprocessing.Process`` that ``ProcessStage`` makes.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import zmq

from omni_core.pipeline.control import bind_address
from omni_core.pipeline.control_keys import ControlKeys, authenticator
from omni_core.pipeline.process_stage import ProcessStage, StageProcessError
from omni_core.pipeline.ray_placement import actor_device
from omni_core.pipeline.stage_process import run_stage_process

ACTOR_DIED = -9  # the exit code reported for an actor that died (Ray does not say with which signal)


class StageActor:
    """Hosts one stage. ``run`` blocks the actor's thread for the stage's lifetime, as a stage
    process's main does; ``where`` answers first, so the runtime knows which process it watches."""

    def where(self) -> tuple[int, str]:
        """This actor's process id and node id."""
        import ray

        return os.getpid(), ray.get_runtime_context().get_node_id()

    def run(self, *args: Any) -> None:
        # A spawned stage ends with the runtime, its parent. An actor's runtime may be on another
        # node, and Ray ends the actor when the runtime goes; what nothing ends is an actor whose
        # raylet died (its node lost, or the head and the raylet after it): the stage watches the
        # raylet, its parent, as a spawned stage watches the runtime, and the process ends with it.
        call = inspect.signature(run_stage_process).bind(*args)
        raylet = call.arguments["parent_pid"] = os.getppid()
        run_stage_process(*call.args, **call.kwargs)
        if os.getppid() != raylet:
            os._exit(1)  # no raylet will ever call this worker again


class ActorProcess:
    """The ``multiprocessing.Process`` calls ``ProcessStage`` makes, on a Ray actor."""

    def __init__(
        self,
        ray: Any,
        options: dict[str, Any],
        args: tuple,
        name: str,
        start_timeout_s: float,
        lost=lambda: None,
    ):
        self.ray = ray
        self.lost = lost  # why the cluster is lost (None: it is not): then no call may wait for its GCS
        self.options = options
        self.args = args
        self.name = name
        self.start_timeout_s = start_timeout_s
        self.actor = None
        self.pid: int | None = None
        self._run = None
        self._exitcode: int | None = None
        self.node_id = ""

    def start(self) -> None:
        ray = self.ray
        actor_class = ray.remote(max_restarts=0, max_task_retries=0)(StageActor)
        self.actor = actor_class.options(name=None, **self.options).remote()
        try:
            self.pid, self.node_id = ray.get(self.actor.where.remote(), timeout=self.start_timeout_s)
        except ray.exceptions.RayError as exc:
            self.kill()  # one still waiting for its bundle would start later, for nobody
            if isinstance(exc, ray.exceptions.GetTimeoutError):
                raise StageProcessError(
                    f"stage {self.name!r}: its Ray actor did not start within {self.start_timeout_s:.0f} s"
                ) from None
            raise StageProcessError(f"stage {self.name!r}: its Ray actor could not start: {exc}") from None
        self._run = self.actor.run.remote(*self.args)

    @property
    def exitcode(self) -> int | None:
        """None while the actor runs its stage; 0 when the stage loop returned (told to stop),
        ``ACTOR_DIED`` when the actor or its node died."""
        if self._exitcode is None and self._run is not None:
            ready, _ = self.ray.wait([self._run], timeout=0)
            if ready:
                try:
                    self.ray.get(ready[0])
                    self._exitcode = 0
                except self.ray.exceptions.RayError:
                    self._exitcode = ACTOR_DIED
        elif self._exitcode is None and self.actor is None:
            self._exitcode = ACTOR_DIED  # never started
        return self._exitcode

    def join(self, timeout: float | None = None) -> None:
        if self._run is not None and self._exitcode is None:
            self.ray.wait([self._run], timeout=timeout)
            self.exitcode  # noqa: B018 - records how the run ended
        if self._exitcode is not None:
            self.kill()  # an actor outlives its method: remove it, its bundle's resources free again

    def is_alive(self) -> bool:
        return self.actor is not None

    def terminate(self) -> None:
        self.kill()

    def kill(self) -> None:
        if self.actor is not None and not self.lost():
            try:
                self.ray.kill(self.actor, no_restart=True)
            except Exception:  # already gone with its node or the cluster
                pass
        self.actor = None


class RayStage(ProcessStage):
    """``placement`` is the pipeline's ``RayPlacement`` (its group placed); ``transport_name``
    the transport to this stage's node."""

    def __init__(
        self,
        pipeline: Any,
        stage: Any,
        device: str,
        emit,
        fail,
        peer: int,
        placement: Any,
        transport_name: str,
    ):
        super().__init__(pipeline, stage, device, emit, fail, peer=peer)
        self.placement = placement
        self.transport_name = transport_name
        self.transport = getattr(self.transport, "for_peer", lambda _: self.transport)(peer)
        self.device = actor_device(device, placement.bundles[stage.name])
        if not placement.same_node(stage.name):  # its control sockets face the network: keys
            self._keys = ControlKeys.new()
            self._auth = authenticator(self._zmq, self._keys)
        # the runtime is not the actor's parent: the actor watches its raylet (StageActor.run)
        self.parent_pid = None

    def _bind(self, socket: zmq.Socket, ipc_path: str) -> str:
        # an actor on the runtime's node reaches it on loopback: nothing else on the network can
        # connect to these sockets (which carry requests' inputs and take emits unauthenticated);
        # one on another node needs the node's address (docs/runtime.md, Placement on Ray)
        host = "127.0.0.1" if self.placement.same_node(self.name) else self.placement.runtime_address
        return bind_address(socket, "tcp", ipc_path, host=host)

    def _launch(self, args: tuple):
        options = self.placement.scheduling(self.name)
        placement = self.placement

        def lost() -> str | None:
            return placement.lost

        return ActorProcess(placement.ray, options, args, self.name, self.start_timeout_s, lost)

    def stats(self) -> dict[str, Any]:
        stats = super().stats()
        # where the actor runs now: a restart after a lost node runs where Ray placed the bundle anew
        node = getattr(self._process, "node_id", "") or self.placement.nodes.get(self.name, "")
        stats.update(node=node, transport=self.transport_name)
        return stats
