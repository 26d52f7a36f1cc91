"""The ``whisper-decode`` engine: continuous batching of Whisper's decoder with a KV cache.

The core ``ar`` engine pages a decoder-only KV cache; Whisper's decoder also attends to its
window's encoder output, so each sequence carries cross-attention keys/values computed once at
admission. This executor keeps both in a packed ``DecodeBatch``: windows of every request join
and leave the running batch between steps. See docs/families/whisper.md.

Stage options: ``max_batch`` (rows decoded together, default 32), ``temperature_fallback``
(default False; see ``_decodes_again``), ``cuda_graphs`` (default True: decode steps on CUDA
replay captured graphs, ``decode_graphs``).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from typing import Any

from omni_core.hooks import number_option
from omni_core.scheduler.batching import describe_error
from omni_core.scheduler.executor import Executor, Message, StageContext

from omni_whisper.cpu_threads import BUSY_DECODERS
from omni_whisper.decode_batch import DecodeBatch
from omni_whisper.decoding import (
    LOGPROB_THRESHOLD,
    RequestState,
    Window,
    compression_ratio,
    window_segments,
)

FALLBACK_STEP = 0.2
MAX_TEMPERATURE = 1.0
COMPRESSION_RATIO_LIMIT = 2.4
log = logging.getLogger("omni.stage")


class WhisperDecodeExecutor(Executor):
    def __init__(self, stage: Any, context: StageContext):
        super().__init__(stage, context)
        self.options = {**getattr(stage, "options", {}), **context.options}
        self.capacity = number_option(self.options, "max_batch", 32)
        self.fallback = bool(self.options.get("temperature_fallback", False))
        self._inbox: deque[Message] = deque()
        self._aborts: set[str] = set()
        self._cond = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._requests: dict[str, RequestState] = {}
        self._waiting: deque[Window] = deque()
        self.steps = 0
        self.fallbacks = 0  # windows decoded again at a higher temperature
        self.alignments_taken = 0  # word-timestamp windows aligned from their batch row (no second cross K/V)
        self.silent_windows = 0  # windows whose text was dropped as no speech (Window.silent)

    def start(self) -> None:
        self.worker = self.stage.factory(self.context)  # a DecoderWorker: model, tokenizer, rules
        self.batch = DecodeBatch(self.worker.model, self.worker.rules, self.capacity, self.worker.source_positions,
                                 cuda_graphs=bool(self.options.get("cuda_graphs", True)))
        self._thread = threading.Thread(target=self._run, name=f"omni-whisper-{self.context.stage}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def submit(self, message: Message) -> None:
        with self._cond:
            self._inbox.append(message)
            self._cond.notify_all()

    def abort(self, request_id: str) -> None:
        with self._cond:
            self._aborts.add(request_id)
            self._cond.notify_all()

    def stats(self) -> dict[str, float]:
        return {
            "running": len(self._requests),
            "rows": len(self.batch) if self._thread else 0,
            "waiting_windows": len(self._waiting),
            "steps": self.steps,
            "fallbacks": self.fallbacks,
            "alignments_taken": self.alignments_taken,
            "silent_windows": self.silent_windows,
            "graph_replays": self.batch.graphs.replays if self._thread and self.batch.graphs else 0,
        }

    # -- the loop ---------------------------------------------------------------------------------

    def _run(self) -> None:
        self.worker.set_threads()
        while True:
            with self._cond:
                while not (self._stopping or self._inbox or self._aborts or self._waiting or len(self.batch)):
                    self._cond.wait()
                if self._stopping:
                    BUSY_DECODERS.mark(self, False)
                    return
                inbox, self._inbox = list(self._inbox), deque()
                aborts, self._aborts = set(self._aborts), set()
            for request_id in aborts:
                self._drop(request_id)
            for message in inbox:
                if message.request_id not in aborts:
                    self._accept(message)
            try:
                with self.worker.lock:
                    self._admit()
                    finished = self.batch.step() if len(self.batch) else None
                if finished is not None:
                    self.steps += 1
                    self._after_step(finished)
            except Exception as exc:  # fail what is running; the engine keeps serving
                log.warning("stage %r: a decode step failed %d requests", self.context.stage, len(self._requests), exc_info=exc)
                for request_id in list(self._requests):
                    self._fail(request_id, describe_error(exc))
            BUSY_DECODERS.mark(self, bool(len(self.batch) or self._waiting))

    def _accept(self, message: Message) -> None:
        payload = message.payload
        try:
            request = self.worker.new_request(message.request_id, payload, live=not self._fallback_for(payload))
        except Exception as exc:
            self.context.fail(message.request_id, str(exc))
            return
        self._requests[request.request_id] = request
        self._waiting.extend(request.windows)

    def _fallback_for(self, payload: dict) -> bool:
        return self.fallback and not float(payload.get("temperature") or 0.0) > 0

    def _admit(self) -> None:
        while self._waiting and self.batch.free_rows():
            window = self._waiting.popleft()
            request = self._requests.get(window.request_id)
            if request is not None:
                self.batch.admit(window, request.encoded[window.index])

    def _after_step(self, finished: list[int]) -> None:
        for request in {w.request_id: self._requests[w.request_id] for w in self.batch.windows}.values():
            if request.live:
                self._stream(request)
        ended = []  # (window, whether it decodes again), decided once
        for row in finished:
            window = self.batch.windows[row]
            request = self._requests[window.request_id]
            again = self._decodes_again(request, window)
            if not again and window.silent():
                window.tokens = []  # no speech: what it decoded is dropped (Whisper skips the window)
                self.silent_windows += 1
            if request.word_timestamps and not again and window.tokens:
                self._take_alignment(row, window)
            ended.append((window, again))
        self.batch.remove(finished)
        for window, again in ended:
            self._finish_window(window, again)

    def _take_alignment(self, row: int, window: Window) -> None:
        """For word timestamps: the alignment of a window that is done, while its cross-attention
        K/V is still in the batch (a failure here leaves it to ``words``, which computes it again
        and fails only that request)."""
        try:
            window.alignment = self.worker.alignment(window, [(k[row : row + 1], v[row : row + 1]) for k, v in self.batch.cross_kv])
        except Exception:
            window.alignment = None
        else:
            self.alignments_taken += window.alignment is not None

    def _decodes_again(self, request: RequestState, window: Window) -> bool:
        """Temperature fallback (when enabled and the request asked for temperature 0): a window
        whose text repeats itself (gzip ratio > 2.4) or is unlikely (mean logprob < -1) decodes
        again at temperature +0.2, up to 1.0; the last attempt is kept. A silent window
        (``Window.silent``) is not decoded again."""
        if request.live or window.temperature + FALLBACK_STEP > MAX_TEMPERATURE + 1e-6 or window.silent():
            return False
        text = self.worker.tokenizer.decode(window.tokens)
        return compression_ratio(text) > COMPRESSION_RATIO_LIMIT or window.avg_logprob < LOGPROB_THRESHOLD

    def _finish_window(self, window: Window, again: bool) -> None:
        request = self._requests[window.request_id]
        if again:
            window.temperature += FALLBACK_STEP
            self.fallbacks += 1
            window.tokens, window.logprob_sum, window.attempt = [], 0.0, window.attempt + 1
            self._waiting.appendleft(window)
            return
        request.done[window.index] = window
        self._stream(request)
        if len(request.done) == len(request.windows):
            self._complete(request)

    # -- output -----------------------------------------------------------------------------------

    def _send(self, request: RequestState, delta: str) -> None:
        if not request.text:
            delta = delta.lstrip()  # Whisper's text starts with a space
        if delta:
            request.text += delta
            self.context.emit(Message(request.request_id, "text", {"text": delta}, end=False, seq=request.seq))
            request.seq += 1

    def _stream(self, request: RequestState) -> None:
        """Send new text in window order: the current window live (if allowed), finished ones whole."""
        tok = self.worker.tokenizer
        while request.emit_index < len(request.windows):
            index = request.emit_index
            window = request.done.get(index) or (request.windows[index] if request.live else None)
            if window is None:
                return
            finished = index in request.done
            if not finished and window.may_be_silent():
                return  # its text may be dropped as no speech (Window.silent): sent once finished
            text = tok.decode(window.tokens)
            if not finished and text.endswith("\ufffd"):
                return  # a character split across tokens: wait for the rest
            if text.startswith(request.sent):
                self._send(request, text[len(request.sent) :])
            request.sent = text
            if not finished:
                return
            request.emit_index, request.sent = index + 1, ""

    def _complete(self, request: RequestState) -> None:
        tok = self.worker.tokenizer
        segments = []
        for index in range(len(request.windows)):
            window = request.done[index]
            window_segs = window_segments(tok, window)
            quality = {
                "temperature": window.temperature,
                "avg_logprob": window.avg_logprob,
                "compression_ratio": compression_ratio(tok.decode([t for t in window.tokens if t < tok.eot])),
                "no_speech_prob": window.no_speech_prob,
            }
            for seg in window_segs:
                seg.update(quality)  # as Whisper's segments: of the window the segment is from
            if request.word_timestamps and window_segs:
                try:
                    words = self.worker.words(request, window)
                except Exception as exc:  # fails this request only, not every row the loop holds
                    log.warning("word timestamps of %s failed", request.request_id, exc_info=exc)
                    self._fail(request.request_id, f"word timestamps: {type(exc).__name__}: {exc}")
                    return
                for word in words:
                    # a word goes to the last segment starting at or before it
                    seg = next((s for s in reversed(window_segs) if s["start"] <= word["start"]), window_segs[0])
                    seg.setdefault("words", []).append(word)
            segments += window_segs
        tokens = sum(len(w.tokens) for w in request.done.values())
        payload = {
            "text": request.text,
            "language": request.language,
            "language_name": self.worker.tokenizer.language_name(request.language),
            "duration": request.duration,
            "segments": segments,
            "usage": {"type": "duration", "seconds": request.duration, "output_tokens": tokens},
        }
        del self._requests[request.request_id]
        self.context.emit(Message(request.request_id, "text", payload, end=True, seq=request.seq))

    def _drop(self, request_id: str) -> None:
        self._requests.pop(request_id, None)
        self._waiting = deque(w for w in self._waiting if w.request_id != request_id)
        self.batch.remove([row for row, w in enumerate(self.batch.windows) if w.request_id == request_id])

    def _fail(self, request_id: str, error: str) -> None:
        self._drop(request_id)
        self.context.fail(request_id, error)
