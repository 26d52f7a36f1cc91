"""The ``code2wav`` stage: the talker's frames of codes in, 24 kHz audio out, streamed in chunks.

A request's frames are decoded once ``first_chunk`` of them have come; after that a chunk is due
once as many new frames have come as were decoded so far, up to ``chunk`` (4, 4, 8, 16, 25, 25,
... frames): each chunk is made while the audio before it plays, so a stream has no gap while a
talker step takes less than a frame's 80 ms (a fixed 25 after the first 4 would need 25 steps
within the first chunk's 320 ms). The rest goes at the end. Each decode reads up to
``left_context`` frames before its own (their samples were sent already), which is how the
reference decodes a long sequence in pieces. Requests whose chunks have the same length and
context run as one batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import torch
from omni_core.scheduler.applied_messages import AppliedMessages
from omni_core.scheduler.host_copy import to_device, to_host
from omni_core.scheduler.stage_stream import StageStream

from .code2wav import Code2Wav


@dataclass
class Chunking:
    first_chunk: int = 4  # frames (80 ms each) before the first audio
    chunk: int = 25  # the most frames a later chunk waits for
    left_context: int = 25

    def due(self, decoded: int) -> int:
        """New frames that make the next chunk, ``decoded`` frames having been decoded."""
        return self.first_chunk if decoded == 0 else min(self.chunk, decoded)


@dataclass
class Decoding:
    frames: torch.Tensor | None = None  # [n, groups]: the frames not decoded yet and the context before them
    count: int = 0  # frames received
    done: int = 0  # frames decoded
    ended: bool = False


class Code2WavWorker:
    def __init__(self, model: Code2Wav, chunking: Chunking):
        self.model = model
        self.chunking = chunking
        self.device = model.code_embedding.weight.device
        self.stream = StageStream(self.device)  # decodes overlap the talker's steps
        self.requests: dict[str, Decoding] = {}
        self.applied = AppliedMessages()

    def process(self, messages, emit) -> None:
        with self.stream():
            self._process(messages, emit)

    def _process(self, messages, emit) -> None:
        jobs = []  # (request id, state): requests with a chunk due
        for message in messages:
            if self.applied.fresh(message):  # a retried batch applies nothing twice
                state = self.requests.setdefault(message.request_id, Decoding())
                codes = torch.as_tensor(message.payload.get("codes", torch.zeros(0, 0))).reshape(-1, self.model.num_quantizers)
                state.frames = codes if state.frames is None else torch.cat([state.frames, codes])
                state.count += codes.shape[0]
                state.ended = state.ended or message.end
            elif message.request_id in self.requests:
                state = self.requests[message.request_id]
            else:  # released meanwhile
                continue
            if state.ended or state.count - state.done >= self.chunking.due(state.done):
                jobs.append((message.request_id, state))
        audio = self._decode(jobs)
        for rid, state in jobs:
            samples = audio.get(rid, torch.zeros(0))
            # only now that the decode worked (a failed batch is retried message by message): keep
            # what later chunks read as context
            state.frames = state.frames[max(0, state.frames.shape[0] - self.chunking.left_context) :]
            state.done = state.count
            if samples.numel() or state.ended:
                emit(rid, "audio", {"audio": samples}, end=state.ended)
            if state.ended:
                self.release(rid)

    @torch.inference_mode()
    def _decode(self, jobs) -> dict[str, torch.Tensor]:
        """Each job's new frames' samples; changes no request's state."""
        groups: dict[tuple[int, int], list[tuple[str, torch.Tensor]]] = defaultdict(list)
        for rid, state in jobs:
            if state.count == state.done:
                continue
            context = min(self.chunking.left_context, state.done)
            window = state.frames[state.frames.shape[0] - (state.count - state.done) - context :]
            groups[(window.shape[0], context)].append((rid, window))
        out: dict[str, torch.Tensor] = {}
        for (_, context), rows in groups.items():
            codes = to_device(torch.stack([w for _, w in rows]).transpose(1, 2).contiguous(), self.device)
            samples = to_host(self.model.decode_chunk(codes, context).float())
            out.update({rid: samples[i] for i, (rid, _) in enumerate(rows)})
        return out

    def release(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.applied.forget(request_id)
