"""Text that arrives in pieces (an LLM's tokens) cut into what can be spoken now.

The marks are those the families' segmenting uses (``omni_core.surface.segments``): a sentence
ends at ``. ! ? ; …`` followed by whitespace (so "3.14" does not cut, and a final "." waits for
the next piece or the end of the text), at ``。！？；`` at once, and at a line break. A sentence
that grows past ``clause_chars`` without ending is cut after its last clause mark (``, :``
before whitespace, or ``，、：``), and one past ``max_chars`` with no clause mark after its last
space (or, for text without spaces, at ``max_chars``): speech starts without waiting for a long
sentence's end. Pieces with no letter or digit (a lone "...") have nothing to speak and are
skipped.
"""

from __future__ import annotations

import re

from omni_core.surface.segments import CLAUSE_END, SENTENCE_END

CLAUSE_CHARS = 120
MAX_CHARS = 300

_ASCII_MARK = re.compile(r"[.!?;…,:]")  # ends only before whitespace: at the text's end, not yet
_SPACE = re.compile(r"\s+")
_SPEAKABLE = re.compile(r"\w")


def _ends(pattern: re.Pattern, text: str) -> list[int]:
    """Where ``pattern`` ends a piece of ``text``, less a mark at its very end that the next
    piece could still continue ("3." before "14")."""
    out = []
    for match in pattern.finditer(text):
        mark = match.group()
        if match.end() == len(text) and not mark[-1].isspace() and _ASCII_MARK.search(mark):
            continue
        out.append(match.end())
    return out


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
        sentence_ends = _ends(SENTENCE_END, text)
        if sentence_ends and sentence_ends[0] <= self.max_chars:
            return sentence_ends[0]
        if len(text) < self.clause_chars:
            return None
        head = text[: self.max_chars]
        clauses = [end for end in _ends(CLAUSE_END, text) if end <= len(head)]
        if clauses:
            return clauses[-1]
        if len(text) < self.max_chars:
            return None
        spaces = [m.end() for m in _SPACE.finditer(head) if m.start() > 0]
        return spaces[-1] if spaces else self.max_chars


def _speakable(piece: str) -> list[str]:
    piece = piece.strip()
    return [piece] if _SPEAKABLE.search(piece) else []
