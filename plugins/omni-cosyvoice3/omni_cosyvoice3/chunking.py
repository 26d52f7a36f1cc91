"""When the flow runs: token-hop chunks with lookahead, the hop growing after each chunk.

The first hop is padded so that prompt + hop ends on a multiple of ``hop`` tokens: every chunk
then ends on a boundary of the DiT's chunk mask, which is what makes the streamed mel equal
the one-shot (chunk-masked) mel. A chunk also needs ``lookahead`` tokens past its end. The hop
doubles after each chunk up to ``max_hop``. Non-streaming requests run once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class FlowStream:
    """Per-request flow state: conditioning, tokens so far, and how far the mel has been emitted."""

    prompt_tokens: list[int]
    prompt_mel: torch.Tensor
    embedding: torch.Tensor
    streaming: bool
    hop: int = 25
    max_hop: int = 100
    lookahead: int = 3
    tokens: list[int] = field(default_factory=list)
    offset: int = 0  # generated tokens whose mel has been emitted
    finished: bool = False
    emitted_end: bool = False
    chunks: int = 0

    def __post_init__(self) -> None:
        p = len(self.prompt_tokens)
        self._pad = -p % self.hop
        self._next_hop = self.hop

    def next_end(self) -> tuple[int, bool] | None:
        """(generated tokens to cover, final) for the flow call due now, or None to wait.

        A non-final end covers whole hops only, as many as the available tokens allow (the
        same mel as taking them one hop at a time)."""
        return self.due_end(len(self.tokens), self.finished)

    def due_end(self, tokens: int, finished: bool) -> tuple[int, bool] | None:
        """``next_end`` as it would be with ``tokens`` generated tokens and ``finished``."""
        if self.emitted_end:
            return None
        if finished:
            return tokens, True
        if not self.streaming:
            return None
        end, hop, reached = self.offset, self._next_hop, None
        while True:
            step = hop + (self._pad if end == 0 else 0)
            if tokens - end < step + self.lookahead:
                break
            end += step
            hop = min(self.max_hop, hop * 2)
            reached = end
        if reached is None:
            return None
        return reached, False

    def advance(self, end: int, final: bool) -> None:
        """Record a flow call that covered ``end`` generated tokens."""
        while self.offset < end and not final:
            step = self._next_hop + (self._pad if self.offset == 0 else 0)
            self.offset += step
            self._next_hop = min(self.max_hop, self._next_hop * 2)
        if final:
            self.offset = end
            self.emitted_end = True
        self.chunks += 1

    def flow_tokens(self, end: int, final: bool) -> torch.Tensor:
        """Prompt tokens + generated tokens up to ``end`` (+ lookahead when not final)."""
        upto = end if final else end + self.lookahead
        return torch.tensor(self.prompt_tokens + self.tokens[:upto], dtype=torch.long)


def due_points(prompt_len: int, hop: int = 25, max_hop: int = 100, lookahead: int = 3):
    """Generated-token counts at which the flow's next chunk becomes due (end + lookahead), in
    order, forever: the llm stage sends its tokens at these points instead of one by one."""
    end, step = 0, hop + (-prompt_len % hop)
    while True:
        end += step
        yield end + lookahead
        hop = min(max_hop, hop * 2)
        step = hop
