"""Per-request state of the MLX ASR engine: a request is one or more audio chunks, each decoded
as its own sequence; their words stream out in chunk order."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .text import UNSPACED, ChunkText, language_code


@dataclass
class ChunkJob:
    job: TranscriptionJob
    index: int
    mel: np.ndarray
    prompt_ids: list[int]
    start: float
    end: float
    max_new_tokens: int
    text: ChunkText
    generated: int = 0
    done: bool = False
    pending: str = ""  # words produced before earlier chunks finished streaming
    joined: bool = False  # the separator before this chunk's words has been written


@dataclass
class TranscriptionJob:
    request_id: str
    duration: float
    temperature: float
    forced_language: str | None
    chunks: list[ChunkJob] = field(default_factory=list)
    streamed: int = 0  # chunks whose words are fully handed out
    seq: int = 0
    text: str = ""

    def _join(self, chunk: ChunkJob, words: str) -> str:
        """Words of ``chunk`` as they continue the request's text (a space between chunks)."""
        if chunk.index > 0 and words and not chunk.joined:
            chunk.joined = True
            language = chunk.text.language or self.forced_language
            if self.text and not self.text[-1].isspace() and language not in UNSPACED:
                return " " + words
        return words

    def accept(self, chunk: ChunkJob, delta: str) -> str:
        """Record ``delta`` of ``chunk``; return what may stream now (only the oldest unfinished
        chunk streams; later chunks wait until it is done)."""
        if chunk.index != self.streamed:
            chunk.pending += delta
            return ""
        out = self._join(chunk, delta)
        self.text += out
        return out

    def chunk_finished(self, chunk: ChunkJob) -> str:
        """Mark ``chunk`` done; return the held words of the chunks that may now stream."""
        chunk.done = True
        released = ""
        while self.streamed < len(self.chunks) and self.chunks[self.streamed].done:
            self.streamed += 1
            if self.streamed < len(self.chunks):
                following = self.chunks[self.streamed]
                words, following.pending = following.pending, ""
                if words:
                    out = self._join(following, words)
                    self.text += out
                    released += out
        return released

    @property
    def finished(self) -> bool:
        return self.streamed == len(self.chunks)

    def result(self) -> dict[str, Any]:
        languages = [c.text.language for c in self.chunks if c.text.language]
        language = self.forced_language or (languages[0] if languages else None)
        prompt_tokens = sum(len(c.prompt_ids) for c in self.chunks)
        completion_tokens = sum(c.generated for c in self.chunks)
        return {
            "text": self.text,
            "language": language_code(language) if language else None,
            "language_name": language.lower() if language else None,  # as OpenAI's verbose_json names it
            "duration": self.duration,
            "segments": [
                {"id": c.index, "start": c.start, "end": c.end, "text": c.text.text} for c in self.chunks
            ],
            "usage": {
                "type": "tokens",
                "input_tokens": prompt_tokens,
                "output_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
