"""Long text in segments, each spoken as its own request and joined in order
(``FamilySpec.split_speech``), as the reference speaks long text in pieces of about
``chunk_length`` UTF-8 bytes (its server's default: 200).

Text with speaker tags (``<|speaker:N|>``) is cut between turns only, as the reference groups
whole turns. Other text is cut and packed by the core's rules (``omni_core.surface.segments``:
sentences, then clauses, words, characters) up to the budget, which no segment passes.

Each segment's payload names its request's segments (``segment``: a ``group`` id, its ``index``
and their ``count``): the dual AR carries the codes of the segments before into its prompt
(``segment_context``), so the plugin runs them in turn (``FamilySpec.segments_in_turn``).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from omni_core.surface import segments

SEGMENT_BYTES = 200
_SPEAKER = re.compile(r"(?=<\|speaker:\d+\|>)")


def _size(text: str) -> int:
    return len(text.encode("utf-8"))


def split_text(text: str, budget: int = SEGMENT_BYTES) -> list[str]:
    if _SPEAKER.search(text):
        turns = [turn for turn in _SPEAKER.split(text) if turn.strip()]
        return segments.pack([(turn, _size(turn)) for turn in turns], budget, join_short_tail=False)
    return segments.split_text(text, _size, budget, join_short_tail=False)


def split_speech(checkpoint_dir: str, payload: dict[str, Any]) -> list[dict[str, Any]]:
    """The payloads of a speech request's segments; a seeded request's segment ``i`` takes seed + i."""
    text = payload.get("text")
    if not isinstance(text, str) or not text.strip():
        return [payload]  # the frontend answers for it
    parts = segments.segment_payloads(payload, split_text(text))
    if len(parts) > 1:
        group = uuid.uuid4().hex
        for index, part in enumerate(parts):
            part["segment"] = {"group": group, "index": index, "count": len(parts)}
    return parts
