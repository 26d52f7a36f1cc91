"""Text that arrives in pieces (an LLM's tokens) cut into what can be spoken now.

A sentence is complete at ``. ! ? …`` followed by whitespace (so "3.14" and "e.g.x" do not
cut, and a final "." waits for the next piece or the end of the text), at ``。！？`` at once,
and at a line break. A sentence that grows past ``clause_chars`` without ending is cut after
its last clause mark (``, ; :`` before whitespace, or ``，、；：``), and one past ``max_chars``
with no clause mark after its last space (or, for text without spaces, at ``max_chars``):
speech starts without waiting for a long sentence's end. Pieces with no letter or digit
(a lone "...") have nothing to speak and are skipped.
"""

from __future__ import annotations

import re

CLAUSE_CHARS = 120
MAX_CHARS = 300

_SENTENCE_END = re.compile(r"[.!?…]+[\"'”’)\]]*\s+|[。！？]+[」』”’)]*\s*|\n\s*")
_CLAUSE_END = re.compile(r"[,;:]+[\"'”’)\]]*\s+|[，、；：]+\s*")
_SPACE = re.compile(r"\s+")
_SPEAKABLE = re.compile(r"\w")


class SentenceCutter:
    def __init__(self, clause_chars: int = CLAUSE_CHARS, max_chars: int = MAX_CHARS):
        self.clause_chars = clause_chars
        self.max_chars = max_chars
        self._pending = ""

    def feed(self, text: str) -> list[str]:
        """The sentences (and long clauses) that ``text`` completes, in order."""
        self._pending += text
        out = []
        while (cut := self._next_cut()) is not None:
            piece, self._pending = self._pending[:cut], self._pending[cut:]
            out.extend(_speakable(piece))
        return out

    def finish(self) -> list[str]:
        """What is left when the text ends."""
        rest, self._pending = self._pending, ""
        return _speakable(rest)

    def _next_cut(self) -> int | None:
        text = self._pending
        end = _SENTENCE_END.search(text)
        if end is not None and end.end() <= self.max_chars:
            return end.end()
        if len(text) < self.clause_chars:
            return None
        head = text[: self.max_chars]
        clauses = [m.end() for m in _CLAUSE_END.finditer(head)]
        if clauses:
            return clauses[-1]
        if len(text) < self.max_chars:
            return None
        spaces = [m.end() for m in _SPACE.finditer(head) if m.start() > 0]
        return spaces[-1] if spaces else self.max_chars


def _speakable(piece: str) -> list[str]:
    piece = piece.strip()
    return [piece] if _SPEAKABLE.search(piece) else []
