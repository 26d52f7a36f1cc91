"""The ``mlx-asr`` engine: an omni Executor that runs Qwen3-ASR on MLX with continuous batching.

The stage factory returns an ``ASRRuntime`` (weights, tokenizer, limits). One thread owns every
MLX call, model loading included (MLX streams belong to the thread that uses them); other
threads only put messages and aborts on its inbox.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np
from omni_core.hooks import number_option
from omni_core.scheduler.executor import Executor, Message, StageContext

from .batcher import ASRBatcher
from .config import load_config
from .jobs import ChunkJob, TranscriptionJob
from .model import ASRNetwork, load_network
from .text import ChunkText
from .tokenizer import end_token_ids, load_tokenizer

_STOP = object()


@dataclass
class ASRRuntime:
    network: ASRNetwork
    tokenizer: Any
    eos_ids: set[int]
    max_batch: int = 32


def load_runtime(checkpoint_dir: str, options: dict[str, Any], context: StageContext | None = None) -> ASRRuntime:
    """Stage factory of the ``asr`` stage (runs on the engine thread)."""
    config = load_config(checkpoint_dir)
    tokenizer = load_tokenizer(checkpoint_dir)
    network = load_network(checkpoint_dir, options.get("dtype"))
    return ASRRuntime(network, tokenizer, end_token_ids(tokenizer, config.eos_token_ids), number_option(options, "max_batch", 32))


def job_from_payload(request_id: str, payload: dict[str, Any], tokenizer) -> TranscriptionJob:
    """The frontend's payload (see ``Frontend.prepare``) -> one job with a chunk per audio piece."""
    mel = np.asarray(payload["mel"], dtype=np.float32)
    job = TranscriptionJob(
        request_id=request_id,
        duration=float(payload["duration"]),
        temperature=float(payload.get("temperature") or 0.0),
        forced_language=payload.get("language"),
    )
    offset = 0
    pieces = zip(
        payload["chunk_frames"], payload["chunk_spans"], payload["prompt_ids"], payload["max_new_tokens"], strict=True
    )
    for index, (frames, (start, end), prompt_ids, budget) in enumerate(pieces):
        job.chunks.append(
            ChunkJob(
                job=job,
                index=index,
                mel=mel[:, offset : offset + frames],
                prompt_ids=list(prompt_ids),
                start=float(start),
                end=float(end),
                max_new_tokens=int(budget),
                text=ChunkText(tokenizer, job.forced_language),
            )
        )
        offset += frames
    if not job.chunks:
        raise ValueError("no audio chunks to transcribe")
    return job


class MLXASRExecutor(Executor):
    def __init__(self, stage: Any, context: StageContext):
        super().__init__(stage, context)
        self.output_port = stage.outputs[0]
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._load_error: BaseException | None = None
        self._gone: set[str] = set()  # aborted requests whose late output must not leave
        self._lock = threading.Lock()
        self._seq: dict[str, int] = {}
        self.runtime: ASRRuntime | None = None
        self.batcher: ASRBatcher | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=f"omni-mlx-asr-{self.context.stage}", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._load_error is not None:
            raise RuntimeError(f"stage {self.context.stage!r} could not load: {self._load_error}") from self._load_error

    def submit(self, message: Message) -> None:
        self._inbox.put(("add", message))

    def abort(self, request_id: str) -> None:
        with self._lock:
            self._gone.add(request_id)
            self._seq.pop(request_id, None)
        self._inbox.put(("abort", request_id))

    def release(self, request_id: str) -> None:
        with self._lock:
            self._seq.pop(request_id, None)
            self._gone.discard(request_id)

    def stop(self) -> None:
        self._inbox.put(_STOP)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def stats(self) -> dict[str, float]:
        stats = {"queue_depth": float(self._inbox.qsize())}
        if self.batcher is not None:
            stats.update(self.batcher.stats())
        return stats

    # -- engine thread ------------------------------------------------------------------------
    def _emit(self, request_id: str, delta: str | None, result: dict[str, Any] | None) -> None:
        with self._lock:
            if request_id in self._gone:
                return
            seq = self._seq.get(request_id, 0)
            self._seq[request_id] = seq + 1
            if result is not None:
                self._seq.pop(request_id, None)
        payload = result if result is not None else {"text": delta}
        self.context.emit(Message(request_id, self.output_port, payload, end=result is not None, seq=seq))

    def _run(self) -> None:
        import mlx.core as mx

        from .platform import mlx_device

        try:
            device = mlx_device({**self.stage.options, **self.context.options}.get("mlx_device"))
            with mx.stream(device):
                self._serve()
        except Exception as error:
            if self._ready.is_set():
                raise
            self._load_error = error  # reported by start()
            self._ready.set()
        finally:
            # MLX keeps per-thread streams (and their worker threads) until told otherwise;
            # left alive, they abort the interpreter at exit
            mx.synchronize()
            mx.clear_streams()

    def _serve(self) -> None:
        try:
            options = {**self.stage.options, **self.context.options}
            self.runtime = self.stage.factory(self.context)
            self.batcher = ASRBatcher(
                self.runtime.network, self.runtime.eos_ids, self._emit, number_option(options, "max_batch", self.runtime.max_batch)
            )
        except BaseException as error:  # reported by start()
            self._load_error = error
            self._ready.set()
            return
        self._ready.set()
        while True:
            try:
                if not self._drain(block=not self.batcher.has_work()):
                    return
                for request_id, error in self.batcher.step():
                    self.context.fail(request_id, error)
            except Exception as error:  # keep serving: fail what was running, drop its state
                for request_id in list(self.batcher.jobs):
                    self.batcher.abort(request_id)
                    self.context.fail(request_id, f"transcription engine error: {error}")

    def _drain(self, block: bool) -> bool:
        """Apply queued submissions and aborts; False once told to stop."""
        while True:
            try:
                item = self._inbox.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                if block and not self.batcher.has_work():
                    continue
                return True
            if item is _STOP:
                return False
            kind, value = item
            if kind == "abort":
                self.batcher.abort(value)
                with self._lock:  # nothing of it is left to emit
                    self._gone.discard(value)
            else:
                self._add(value)
            block = False

    def _add(self, message: Message) -> None:
        with self._lock:
            if message.request_id in self._gone:
                return
        try:
            self.batcher.add(job_from_payload(message.request_id, message.payload, self.runtime.tokenizer))
        except Exception as error:
            self.context.fail(message.request_id, f"bad transcription input: {error}")
