"""The ``ar`` executor: a stage whose worker is an ``ARStageWorker``, run on an AREngine in a thread."""

from __future__ import annotations

import logging
from typing import Any

from omni_core.scheduler.ar_stage import ARStageWorker
from omni_core.scheduler.engine import AREngine, RequestOutput
from omni_core.scheduler.engine_loop import EngineLoop
from omni_core.scheduler.executor import Executor, Message

log = logging.getLogger(__name__)


class ARExecutor(Executor):
    """A request's first message becomes an engine request (``worker.make_request``), its later
    ones (chunks of a stream edge) go to ``worker.on_input``; every step's new tokens go to
    ``worker.on_output`` with an ``emit`` bound to the request. ``abort`` frees KV blocks before
    the next step. A request that fails (bad input, a raising handler) fails alone. A request that
    ends without its last output (aborted or failed) gets ``worker.release``; one whose
    ``on_output`` returns True (it sent its last message itself) is dropped from the engine."""

    def start(self) -> None:
        worker = self.stage.factory(self.context)
        if not isinstance(worker, ARStageWorker):
            raise TypeError(f"stage {self.context.stage!r}: an 'ar' factory must return an ARStageWorker, got {type(worker).__name__}")
        self.worker = worker
        hooks = worker.hooks
        pm = self.context.plugin_manager
        if pm is not None and hasattr(pm, "stage_hooks"):  # another plugin may replace or wrap the family's
            options = {**(getattr(self.stage, "options", None) or {}), **self.context.options}
            family = self.context.family or str(options.get("family", ""))
            supplied = pm.stage_hooks(family, self.context.stage, options, hooks)
            if supplied is not None:
                hooks = supplied
        self.engine = AREngine(worker.model, worker.engine_config, hooks=hooks, device=self.context.device)
        worker.max_model_len = self.engine.max_model_len
        worker.engine = self.engine
        self._seq: dict[str, dict[str, int]] = {}  # request id -> port -> next chunk number
        self._aborting: set[str] = set()  # aborted, but the loop may still deliver one step
        self.loop = EngineLoop(self.engine, self._deliver, self._fail, name=f"ar-{self.context.stage}", on_abort=self._aborted)
        self.loop.start()

    def submit(self, message: Message) -> None:
        if message.seq == 0:
            self.loop.add(message.request_id, lambda: self.worker.make_request(self._adopted(message)))
        else:  # a later chunk of the stream the request is fed from
            self.loop.call(message.request_id, lambda: self.worker.on_input(self._adopted(message)))

    def _adopted(self, message: Message) -> Message:
        self.loop.adopt(message.payload)
        return message

    def abort(self, request_id: str) -> None:
        self._aborting.add(request_id)
        self.loop.abort(request_id)

    def _aborted(self, request_id: str) -> None:
        self._aborting.discard(request_id)
        self._forget(request_id)
        self._release(request_id)

    def stop(self) -> None:
        loop = getattr(self, "loop", None)
        if loop is not None:
            loop.stop()

    def stats(self) -> dict[str, float]:
        loop = getattr(self, "loop", None)
        return dict(loop.stats) if loop is not None else {}

    def _emitter(self, request_id: str):
        def emit(port: str, payload: dict[str, Any], end: bool = False) -> None:
            counters = self._seq.setdefault(request_id, {})
            seq = counters.get(port, 0)
            counters[port] = seq + 1
            self.context.emit(Message(request_id, port, payload, end=end, seq=seq))

        return emit

    def _deliver(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            if out.request_id in self._aborting:
                continue
            try:
                done = self.worker.on_output(out.request_id, out.new_token_ids, out.finished, out.step_outputs, self._emitter(out.request_id))
            except Exception as exc:
                log.exception("on_output failed for %s", out.request_id)
                self.engine.abort(out.request_id)  # runs in the loop thread: safe
                self._fail(out.request_id, f"{type(exc).__name__}: {exc}")
                continue
            if out.finished:
                self._forget(out.request_id)
            elif done:  # the worker ended the request itself (a stop string): free its blocks now
                self.engine.abort(out.request_id)
                self._forget(out.request_id)

    def _fail(self, request_id: str, error: str) -> None:
        self._forget(request_id)
        self._release(request_id)
        if request_id in self._aborting:
            return
        self.context.fail(request_id, error)

    def _forget(self, request_id: str) -> None:
        self._seq.pop(request_id, None)

    def _release(self, request_id: str) -> None:
        try:
            self.worker.release(request_id)
        except Exception:  # a broken release must not stop the engine's thread
            log.exception("release failed for %s", request_id)
