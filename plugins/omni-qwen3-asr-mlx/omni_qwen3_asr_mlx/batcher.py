"""Continuous batching of transcription chunks on one MLX model.

Each engine ``step`` admits waiting chunks up to ``max_batch`` running rows (encode the audio,
prefill the prompt alone, merge its KV rows into the running batch), then decodes one token for
every running row in a single forward pass. Finished rows leave the batch at once, so new
requests never wait for a whole batch to drain. Plain Python apart from the model calls; one
host sync per step (the sampled tokens).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import numpy as np

from .jobs import ChunkJob, TranscriptionJob
from .kv_cache import BatchKVCache
from .model import ASRNetwork

# (request_id, delta or None, final result or None)
Emit = Callable[[str, str | None, dict[str, Any] | None], None]


class ASRBatcher:
    def __init__(self, network: ASRNetwork, eos_ids: set[int], emit: Emit, max_batch: int = 32):
        self.network = network
        self.decoder = network.decoder
        self.eos_ids = eos_ids
        self.emit = emit
        self.max_batch = max_batch
        self.jobs: dict[str, TranscriptionJob] = {}
        self.waiting: deque[ChunkJob] = deque()
        self.rows: list[ChunkJob] = []
        self.last_tokens: list[int] = []
        self.cache: BatchKVCache = self.decoder.new_cache(0)

    # -- requests -------------------------------------------------------------------------
    def add(self, job: TranscriptionJob) -> None:
        if job.request_id in self.jobs:
            raise ValueError(f"request {job.request_id!r} is already running")
        self.jobs[job.request_id] = job
        self.waiting.extend(job.chunks)

    def abort(self, request_id: str) -> bool:
        job = self.jobs.pop(request_id, None)
        if job is None:
            return False
        self.waiting = deque(c for c in self.waiting if c.job is not job)
        self._drop_rows([i for i, row in enumerate(self.rows) if row.job is job])
        return True

    def has_work(self) -> bool:
        return bool(self.rows or self.waiting)

    def stats(self) -> dict[str, float]:
        return {
            "running_requests": float(len(self.jobs)),
            "running_rows": float(len(self.rows)),
            "waiting_chunks": float(len(self.waiting)),
            "kv_cache_bytes": float(self.cache.nbytes()),
        }

    # -- engine step ----------------------------------------------------------------------
    def step(self) -> list[tuple[str, str]]:
        """Admit and decode once. Returns (request_id, error) for requests that failed."""
        failures = self._admit()
        if self.rows:
            try:
                self._decode()
            except Exception as error:  # a broken batch fails its requests, not the engine
                for job in {row.job.request_id: row.job for row in self.rows}.values():
                    failures.append((job.request_id, f"decoding failed: {error}"))
                    self.abort(job.request_id)
        return failures

    def _admit(self) -> list[tuple[str, str]]:
        """Start waiting chunks: encode their audio and prefill their prompts as one batch."""
        failures: list[tuple[str, str]] = []
        group: list[ChunkJob] = []
        while self.waiting and len(self.rows) + len(group) < self.max_batch:
            chunk = self.waiting.popleft()
            if chunk.mel is None or chunk.mel.shape[1] == 0:
                failures.append((chunk.job.request_id, "cannot start transcription: empty audio chunk"))
                self.abort(chunk.job.request_id)
                continue
            group.append(chunk)
        group = [chunk for chunk in group if chunk.job.request_id in self.jobs]
        if not group:
            return failures
        try:
            self._start(group, *self._prefill(group))
        except Exception:
            # find the chunk at fault: start the group one chunk at a time
            for chunk in group:
                if chunk.job.request_id not in self.jobs:
                    continue  # its request already failed
                try:
                    self._start([chunk], *self._prefill([chunk]))
                except Exception as error:
                    failures.append((chunk.job.request_id, f"cannot start transcription: {error}"))
                    self.abort(chunk.job.request_id)
        return failures

    def _start(self, group: list[ChunkJob], tokens: list[int], cache: BatchKVCache) -> None:
        """Add prefilled chunks to the running batch and feed them their first token."""
        self.cache.merge(cache)
        first = len(self.rows)
        self.rows.extend(group)
        self.last_tokens.extend(tokens)
        finished = []
        for offset, (chunk, token) in enumerate(zip(group, tokens, strict=True)):
            chunk.mel = None  # features are no longer needed once encoded
            if self._accept(chunk, token):
                finished.append(first + offset)
        self._drop_rows(finished)

    def _prefill(self, group: list[ChunkJob]) -> tuple[list[int], BatchKVCache]:
        audio = self.network.encode_many([chunk.mel for chunk in group])
        prompts = [self.network.prompt_embeddings(c.prompt_ids, a) for c, a in zip(group, audio, strict=True)]
        logits, cache = self.decoder.prefill(prompts)
        tokens = self._sample(logits, [chunk.job.temperature for chunk in group]).tolist()
        return tokens, cache

    def _decode(self) -> None:
        tokens = mx.array(np.asarray(self.last_tokens, dtype=np.int32))[:, None]
        logits = self.decoder(self.decoder.embed_tokens(tokens), self.cache)
        sampled = self._sample(logits, [row.job.temperature for row in self.rows])
        finished = []
        for index, (row, token) in enumerate(zip(self.rows, sampled.tolist(), strict=True)):
            self.last_tokens[index] = token
            if self._accept(row, token):
                finished.append(index)
        self._drop_rows(finished)

    def _sample(self, logits: mx.array, temperatures: list[float]) -> np.ndarray:
        logits = logits[:, -1, :].astype(mx.float32)
        greedy = mx.argmax(logits, axis=-1)
        if not any(t > 0 for t in temperatures):
            return np.array(greedy)
        temps = mx.array(np.maximum(np.asarray(temperatures, dtype=np.float32), 1e-5))[:, None]
        sampled = mx.random.categorical(logits / temps, axis=-1)
        use_sample = mx.array(np.asarray(temperatures) > 0)
        return np.array(mx.where(use_sample, sampled, greedy))

    def _accept(self, chunk: ChunkJob, token: int) -> bool:
        """Feed one sampled token to its chunk; True when the chunk is finished."""
        job = chunk.job
        done = token in self.eos_ids
        if not done:
            chunk.generated += 1
            delta = job.accept(chunk, chunk.text.push(token))
            if delta:
                self.emit(job.request_id, delta, None)
            done = chunk.generated >= chunk.max_new_tokens
        if done:
            tail = job.accept(chunk, chunk.text.finish()) + job.chunk_finished(chunk)
            if tail:
                self.emit(job.request_id, tail, None)
            if job.finished:
                self.jobs.pop(job.request_id, None)
                self.emit(job.request_id, None, job.result())
        return done

    def _drop_rows(self, indices: list[int]) -> None:
        if not indices:
            return
        gone = set(indices)
        keep = [i for i in range(len(self.rows)) if i not in gone]
        self.rows = [self.rows[i] for i in keep]
        self.last_tokens = [self.last_tokens[i] for i in keep]
        if keep:
            self.cache.keep(keep)
        else:
            self.cache = self.decoder.new_cache(0)
