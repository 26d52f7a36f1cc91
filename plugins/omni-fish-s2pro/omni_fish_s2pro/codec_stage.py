"""The ``codec`` stage: the dual AR's frames of codes in, 44.1 kHz audio out, streamed in chunks.

A request's first chunk is decoded once ``first_chunk`` frames have come; after that a chunk is
due once as many new frames have come as were decoded so far, up to ``chunk`` (each chunk is
made while the audio before it plays); the rest goes at the end. Each request decodes through
its own ``CodecStream``, which continues the codec's state from the chunk before (its audio
joined equals the whole decode); requests whose chunks have the same shape (frames, kept
positions, context) decode in one batch.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import torch
from omni_core.scheduler.applied_messages import AppliedMessages

from .codec import Codec
from .codec_stream import DEFAULT_LEFT_CONTEXT, CodecStream, decode_together


@dataclass
class Chunking:
    first_chunk: int = 4  # frames (~46 ms each) before the first audio
    chunk: int = 32  # the most frames a later chunk waits for
    left_context: int = DEFAULT_LEFT_CONTEXT  # frames of latents decoded again before each chunk

    def due(self, decoded: int) -> int:
        """New frames that make the next chunk, ``decoded`` frames having been decoded."""
        return self.first_chunk if decoded == 0 else min(self.chunk, decoded)


@dataclass
class Decoding:
    stream: CodecStream
    pending: list[torch.Tensor] = field(default_factory=list)  # frames [n, num_codebooks] not decoded yet
    waiting: int = 0  # frames in ``pending``
    decoded: int = 0
    ended: bool = False


class CodecWorker:
    def __init__(self, codec: Codec, chunking: Chunking):
        self.codec = codec
        self.chunking = chunking
        self.device = next(codec.parameters()).device
        self.requests: dict[str, Decoding] = {}
        self.applied = AppliedMessages()

    def process(self, messages, emit) -> None:
        touched: dict[str, Decoding] = {}
        for message in messages:
            if self.applied.fresh(message):  # a retried batch applies nothing twice
                state = self.requests.get(message.request_id)
                if state is None:
                    state = self.requests[message.request_id] = Decoding(
                        CodecStream(self.codec, self.chunking.left_context)
                    )
                codes = torch.as_tensor(message.payload.get("codes", torch.zeros(0, 0))).reshape(
                    -1, self.codec.num_codebooks
                )
                state.pending.append(codes)
                state.waiting += codes.shape[0]
                state.ended = state.ended or message.end
            elif message.request_id not in self.requests:  # released meanwhile
                continue
            touched[message.request_id] = self.requests[message.request_id]
        due = [
            (rid, state)
            for rid, state in touched.items()
            if state.ended or state.waiting >= self.chunking.due(state.decoded)
        ]
        self._decode(due, emit)

    def _decode(self, jobs: list[tuple[str, Decoding]], emit) -> None:
        """The due requests' pending frames, those of equal shapes in one batch."""
        groups: dict[tuple, list[tuple[str, Decoding, torch.Tensor]]] = defaultdict(list)
        for rid, state in jobs:
            codes = torch.cat(state.pending).to(self.device).T
            groups[state.stream.shape_key(codes.shape[-1])].append((rid, state, codes))
        for rows in groups.values():
            audio = decode_together([state.stream for _, state, _ in rows], [codes for _, _, codes in rows])
            for (rid, state, _), samples in zip(rows, audio, strict=True):
                state.pending, state.decoded, state.waiting = [], state.decoded + state.waiting, 0
                samples = samples.float().cpu()
                if samples.numel() or state.ended:
                    emit(rid, "audio", {"audio": samples}, end=state.ended)
                if state.ended:
                    self.release(rid)

    def release(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.applied.forget(request_id)
