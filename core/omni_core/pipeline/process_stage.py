"""A stage placed in its own process, seen from the runtime as an ``Executor``.

``ProcessStage`` spawns the child (``stage_process.run_stage_process``), forwards messages,
aborts and releases to it over zmq, and routes what it emits. A monitor thread reads the child's
messages and watches the process: when it dies, the requests it held fail with a transient
error (``StageUnavailable``, with when the stage should be back), a new child is spawned, and
messages submitted meanwhile wait (bounded by their request's deadline) and then go to it.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import zmq

from omni_core.comm.framing import FramingError
from omni_core.pipeline import control_keys
from omni_core.pipeline.control import Channel, ChannelClosed, bind_address, receive
from omni_core.pipeline.stage_process import run_stage_process
from omni_core.scheduler.executor import Executor, Message, StageContext

log = logging.getLogger(__name__)

POLL_MS = 50  # the monitor's poll interval: also how soon a dead child is noticed
START_TIMEOUT_S = 180.0
MAX_RESTARTS_IN_A_ROW = 3
STOP_SEND_S = 1.0  # how long the stop message may wait for a child that takes no messages


class StageProcessError(RuntimeError):
    pass


class ProcessStage(Executor):
    def __init__(self, pipeline: Any, stage: Any, device: str, emit, fail, peer: int = 1):
        super().__init__(stage, StageContext(stage.name, device, emit, fail, options=dict(stage.options)))
        self.name = stage.name
        self.device = device
        self.pipeline = pipeline
        self.transport = pipeline._transport
        self.transport_name = pipeline.transport_name
        self.parent_pid: int | None = os.getpid()  # the child exits when this process is gone
        self.peer = peer  # this stage process's rank on the transport (the runtime is 0)
        self._emit, self._fail = emit, fail
        self.start_timeout_s = float(stage.options.get("start_timeout_s", START_TIMEOUT_S))
        self._zmq = zmq.Context()
        self._dir = tempfile.mkdtemp(prefix="omni-ctl-")
        self._lock = threading.Lock()
        self._state = "new"  # new | running | restarting | dead | stopped
        self._dead_reason = ""
        self._inflight: set[str] = set()
        self._waiting: list[Message] = []  # submitted while the child restarts
        self._generation = 0
        self._process: multiprocessing.Process | None = None
        self._out: Channel | None = None
        self._pull: zmq.Socket | None = None
        self._monitor: threading.Thread | None = None
        self._child_stats: dict[str, Any] = {}
        self.restarts = 0
        self.pid: int | None = None
        self.start_seconds = 1.0  # how long the last start took: how soon a restart is expected back
        self._restart_began = 0.0
        self._keys = None  # ControlKeys where the child connects from another host (RayStage)
        self._auth = None  # the ZAP handler that lets in the keys' client alone

    # -- lifecycle --------------------------------------------------------------------------------

    def start(self) -> None:
        self._spawn_and_wait()
        with self._lock:
            self._state = "running"
        self._monitor = threading.Thread(target=self._watch, name=f"omni-proc-{self.name}", daemon=True)
        self._monitor.start()

    def _spawn_and_wait(self) -> None:
        began = time.monotonic()
        self._generation += 1
        base = os.path.join(self._dir, f"{self.name[:20]}-{self._generation}")
        push = self._zmq.socket(zmq.PUSH)
        pull = self._zmq.socket(zmq.PULL)
        if self._keys is not None:
            for socket in (push, pull):
                control_keys.serve(socket, self._keys)
        inbox = self._bind(push, base + "-in")
        outbox = self._bind(pull, base + "-out")
        process = self._launch(
            (
                self.pipeline.rebuild,
                self.name,
                self.device,
                self.transport_name,
                self.pipeline.prefix,
                inbox,
                outbox,
                self.parent_pid,
                plugins_needed(self.pipeline.plugin_manager, self.stage, self.transport_name, self.device),
                self.transport.peer_options(self.peer),
                None if self._keys is None else self._keys.client_side(),
            )
        )
        try:
            process.start()
            self._await_ready(process, pull)
        except BaseException:
            push.close(linger=0)
            pull.close(linger=0)
            _end_process(process)
            raise
        with self._lock:
            old = (self._out, self._pull)
            self._process, self._pull, self._out = process, pull, Channel(push, self.transport, self.peer)
            self.pid = process.pid
            self.start_seconds = time.monotonic() - began
        for sock in old:
            if sock is not None:
                sock.close() if isinstance(sock, Channel) else sock.close(linger=0)

    def _bind(self, socket: zmq.Socket, ipc_path: str) -> str:
        return bind_address(socket, self.pipeline.control, ipc_path)

    def _launch(self, args: tuple):
        """The child, not started yet: anything with ``start``, ``pid``, ``exitcode``, ``join``,
        ``is_alive``, ``terminate`` and ``kill`` (a Ray actor in ``RayStage``)."""
        return multiprocessing.get_context("spawn").Process(
            target=run_stage_process, args=args, name=f"omni-stage-{self.name}", daemon=True
        )

    def _await_ready(self, process, pull) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            received = receive(pull, self.transport, POLL_MS, self.peer)
            if received is not None:
                header, _ = received
                if header.get("op") == "ready":
                    return
                if header.get("op") == "error":
                    raise StageProcessError(
                        f"stage {self.name!r} failed in its process: {header.get('message')}\n{header.get('traceback', '')}"
                    )
            elif process.exitcode is not None:
                raise StageProcessError(
                    f"stage {self.name!r}: its process exited with code {process.exitcode} while starting"
                )
        raise StageProcessError(
            f"stage {self.name!r}: its process did not start within {self.start_timeout_s:.0f} s"
        )

    def stop(self) -> None:
        with self._lock:
            if self._state == "stopped":
                return
            self._state = "stopped"
            out, process = self._out, self._process
        if out is not None:
            try:
                out.send({"op": "stop"}, timeout_s=STOP_SEND_S)
            except (zmq.ZMQError, ChannelClosed):
                pass  # the child is gone or stuck: it is ended below
        if process is not None:
            _end_process(process)
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=2)
        with self._lock:
            if self._out is not None:
                self._out.close()
            if self._pull is not None:
                self._pull.close(linger=0)
        if self._auth is not None:
            self._auth.stop()
        if self._monitor is None or not self._monitor.is_alive():
            self._zmq.term()
        # else the monitor is still starting a child that may never come (a Ray actor whose cluster
        # is lost) with its new sockets open, and term() would wait for them: the context is left
        shutil.rmtree(self._dir, ignore_errors=True)

    # -- requests ---------------------------------------------------------------------------------

    def submit(self, message: Message) -> None:
        # the send runs outside the lock: with a transport whose sends block until the child
        # receives (gloo, NCCL), the monitor thread must still take the lock to read the child's
        # emits, or the child, blocked sending one, never comes back to receive this
        with self._lock:
            state, out, dead_reason = self._state, self._out, self._dead_reason
            if state == "restarting":
                self._waiting.append(message)
                return
            if state == "running":
                self._inflight.add(message.request_id)
        if state == "running":
            try:
                out.send_message("msg", message)  # the channel serialises its own sends
                return
            except FramingError as exc:
                error = f"input {message.port!r}: {exc}"
            except ChannelClosed as exc:
                with self._lock:  # the child died meanwhile: its restart fails the request (transient)
                    if self._state == "restarting" and message.request_id not in self._inflight:
                        return
                error = f"cannot reach the stage process: {exc}"
            except zmq.ZMQError as exc:
                error = f"cannot reach the stage process: {exc}"
        else:
            error = dead_reason or f"stage process is {state}"
        self._fail(message.request_id, error)

    def _send_op(self, op: str, request_id: str) -> None:
        with self._lock:
            self._inflight.discard(request_id)
            self._waiting = [m for m in self._waiting if m.request_id != request_id]
            running, out = self._state == "running", self._out
        if running:  # outside the lock, as in submit
            try:
                out.send({"op": op, "rid": request_id})
            except (zmq.ZMQError, ChannelClosed):
                pass

    def abort(self, request_id: str) -> None:
        self._send_op("abort", request_id)

    def release(self, request_id: str) -> None:
        self._send_op("release", request_id)

    def restart_wait(self, request_id: str) -> float | None:
        """Seconds until the restarting child is expected back, when a message of the request
        waits for it; None otherwise."""
        with self._lock:
            if self._state != "restarting" or not any(m.request_id == request_id for m in self._waiting):
                return None
            return self._expected_back()

    def _expected_back(self) -> float:
        """With the lock held: seconds until the child being restarted should be ready (as long
        as its last start took; at least 1)."""
        return max(1.0, self.start_seconds - (time.monotonic() - self._restart_began))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            stats = dict(self._child_stats)
            stats.update(
                inflight=len(self._inflight), restarts=self.restarts, pid=self.pid, state=self._state
            )
        return stats

    # -- monitor ----------------------------------------------------------------------------------

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._state == "stopped":
                    return
                pull, process = self._pull, self._process
            try:
                received = receive(pull, self.transport, POLL_MS, self.peer)
            except zmq.ZMQError:
                received = None  # socket closed by stop()
            if received is not None:
                self._handle(*received)
            elif process.exitcode is not None:
                self._restart(process.exitcode)

    def _handle(self, header: dict[str, Any], message: Message | None) -> None:
        op = header.get("op")
        if op == "emit":
            if message is not None:
                self._emit(message)
            else:
                self._fail(str(header.get("rid")), header.get("unpack_error", "bad frame"))
        elif op == "fail":
            self._fail(str(header.get("rid")), str(header.get("error")))
        elif op == "stats":
            with self._lock:
                self._child_stats = dict(header.get("stats") or {})

    def _restart(self, exitcode: int) -> None:
        with self._lock:
            if self._state != "running":
                return
            self._state = "restarting"
            self._restart_began = time.monotonic()
            lost, self._inflight = self._inflight, set()
            self.restarts += 1
            retry_after = self._expected_back()
            dead = self._out
        if dead is not None:
            dead.close()  # a thread still sending to the dead child gets ChannelClosed now
        log.warning(
            "stage %r: process %s died (exit code %s); %d request(s) fail",
            self.name,
            self.pid,
            exitcode,
            len(lost),
        )
        if self.pid is not None:
            self.transport.release_process(self.pid)  # shared memory the dead child had written
        if not self.transport.supports_restart:
            reason = (
                f"stage process died (exit code {exitcode}); transport {self.transport.name!r} "
                "cannot take a restarted process: restart the pipeline"
            )
            with self._lock:
                self._state, self._dead_reason = "dead", reason
                waiting, self._waiting = self._waiting, []
            for request_id in lost | {m.request_id for m in waiting}:
                self._fail(request_id, reason)
            return
        reason = f"stage process died (exit code {exitcode}); it is being restarted"
        for request_id in lost:  # transient: the same request succeeds once the stage is back
            self._fail(request_id, reason, retry_after)
        for attempt in range(MAX_RESTARTS_IN_A_ROW):
            try:
                self._spawn_and_wait()
                break
            except Exception as exc:
                reason = f"stage process could not be restarted: {exc}"
                log.error("stage %r: restart %d failed: %s", self.name, attempt + 1, exc)
        else:
            with self._lock:
                self._state, self._dead_reason = "dead", reason
                waiting, self._waiting = self._waiting, []
            for message in waiting:
                self._fail(message.request_id, reason)
            return
        with self._lock:
            if self._state == "stopped":
                return
            self._state = "running"
            waiting, self._waiting = self._waiting, []
        for message in waiting:
            self.submit(message)


def plugins_needed(manager: Any, stage: Any, transport: str, device: str) -> list[str]:
    """Entry-point names of the plugins a stage process loads: those providing the stage's
    engine, the transport, the device's platform and the stage's family (``options["family"]``),
    and every plugin that supplies AR stage hooks."""
    device_type = device.split(":", 1)[0]
    family = stage.options.get("family")
    names = []
    for record in manager.records:
        if record.status != "ok":
            continue
        provided = record.provided
        if (
            any(e.name == stage.engine for e in provided.get("engines", []))
            or any(t.name == transport for t in provided.get("transports", []))
            or any(getattr(p, "device_type", None) == device_type for p in provided.get("platforms", []))
            or any(f.name == family for f in provided.get("families", []))
            or "omni_stage_hooks" in record.hooks
        ):
            names.append(record.name)
    return names


def _end_process(process: multiprocessing.Process) -> None:
    if process.pid is None:
        return  # never started
    process.join(timeout=3)
    if process.is_alive():
        process.terminate()
        process.join(timeout=2)
    if process.is_alive():
        process.kill()
        process.join(timeout=2)
