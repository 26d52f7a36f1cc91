"""The main function of a spawned stage process.

It rebuilds the topology with the picklable ``rebuild`` callable, takes its stage, and builds and
runs the executor with ``build_executor``, the same function the in-process runtime uses. It
exits when told to stop or when the runtime process is gone.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import traceback
from collections.abc import Callable
from typing import Any

import zmq

from omni_core import logs
from omni_core.comm.framing import FramingError
from omni_core.pipeline.control import Channel, receive
from omni_core.pipeline.control_keys import connect_with
from omni_core.pipeline.process_exit import exit_without_finalizing
from omni_core.pipeline.stage_host import build_executor, release_request

STATS_INTERVAL_S = 0.2


def run_stage_process(
    rebuild: Callable[[], Any],
    stage_name: str,
    device: str,
    transport_name: str,
    prefix: str,
    inbox: str,
    outbox: str,
    parent_pid: int | None,
    plugins: list[str] | None = None,
    transport_options: dict[str, Any] | None = None,
    keys: dict[str, bytes] | None = None,
) -> None:
    """``keys``: the CURVE keys to connect with, where the runtime is on another host."""
    logs.configure_from_environment()
    context = zmq.Context()
    pull = context.socket(zmq.PULL)
    push = context.socket(zmq.PUSH)
    if keys is not None:
        for socket in (pull, push):
            connect_with(socket, keys)
    pull.connect(inbox)
    push.connect(outbox)
    try:
        from omni_core.hooks import PluginManager

        # only the plugins this stage needs: others may be slow to import
        manager = PluginManager(selection=None if plugins is None else set(plugins))
        options = {"prefix": prefix, "device": device, **(transport_options or {})}
        transport = manager.transport(transport_name).factory(options)
        out = Channel(push, transport)
        executor = _start_executor(rebuild, stage_name, device, manager, out)
    except BaseException as exc:
        Channel(push, None).send(
            {"op": "error", "message": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        )
        pull.close(linger=0)
        push.close(linger=2000)  # let the error reach the runtime
        context.term()
        return
    out.send({"op": "ready", "pid": os.getpid()})
    try:
        _serve(pull, out, transport, executor, parent_pid)
    finally:
        executor.stop()
        pull.close(linger=0)
        push.close(linger=1000)
        context.term()
    _end_without_teardown()


def _end_without_teardown() -> None:
    """Ends a process that multiprocessing started for this stage, now that the stage has stopped
    and its sockets are closed, without the interpreter's finalization (``process_exit``): the
    runtime waits for each stage process it stops. A host that runs this function in a process
    of its own (a Ray actor's method) keeps its process."""
    if multiprocessing.parent_process() is not None:
        exit_without_finalizing(0)


def _start_executor(rebuild, stage_name, device, plugins, out: Channel):
    def emit(message) -> None:
        try:
            out.send_message("emit", message)
        except FramingError as exc:
            out.send({"op": "fail", "rid": message.request_id, "error": f"output {message.port!r}: {exc}"})

    def fail(request_id: str, error: str) -> None:
        out.send({"op": "fail", "rid": request_id, "error": error})

    topology = rebuild()
    stage = topology.stage(stage_name)
    executor = build_executor(stage, device=device, emit=emit, fail=fail, plugin_manager=plugins, family=topology.name)
    executor.start()
    return executor


def _serve(pull, out: Channel, transport, executor, parent_pid: int | None) -> None:
    next_stats = 0.0
    while True:
        # None: the host ends this process with the runtime's (a Ray actor shares its owner's fate)
        if parent_pid is not None and os.getppid() != parent_pid:
            transport.close()  # the runtime process died: free what nobody will read
            return
        now = time.monotonic()
        if now >= next_stats:
            out.send({"op": "stats", "stats": dict(executor.stats())})
            next_stats = now + STATS_INTERVAL_S
        received = receive(pull, transport, timeout_ms=100)
        if received is None:
            continue
        header, message = received
        op = header.get("op")
        if op == "msg":
            if message is None:
                out.send(
                    {"op": "fail", "rid": header.get("rid"), "error": header.get("unpack_error", "bad frame")}
                )
            else:
                executor.submit(message)
        elif op == "abort":
            executor.abort(str(header["rid"]))
            transport.release(str(header["rid"]))
        elif op == "release":
            release_request(executor, str(header["rid"]))
            transport.release(str(header["rid"]))
        elif op == "stop":
            return
