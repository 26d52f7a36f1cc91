"""One voice across a long text's segments: each segment's prompt carries the segments spoken
before it, as turns of the same chat, so the slow AR goes on in the voice it has been speaking.

A segment's own prompt is the system turn (instruction, reference) then its user turn and the
open assistant turn. With context, the turns of earlier segments come between them, each its
user turn (its text) and its assistant turn closed with the codes it generated:

    <system turn>
    <|im_start|>user\\n{text 0}<|im_end|>\\n<|im_start|>assistant\\n<|voice|>{codes 0}<|im_end|>\\n
    ...
    <|im_start|>user\\n{text i}<|im_end|>\\n<|im_start|>assistant\\n<|voice|>

as the reference's long-text generation grows its conversation. The reference keeps every turn;
here at most ``keep`` earlier segments are carried, the most recent ones, and fewer when the
prompt would leave less than a whole reply's room (``max_new_tokens``) in ``max_model_len``.

``SpokenSegments`` holds the turns per request (a segment group) on the stage's thread; a group
is dropped when its last segment ends or any of its segments fails, and at most ``MAX_GROUPS``
are held (the oldest dropped first), so an abandoned request cannot grow it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

MAX_GROUPS = 256


@dataclass
class SpokenTurn:
    turn_ids: list[int]  # the segment's user turn and open assistant turn (its prompt from turn_start)
    codes: torch.Tensor  # [num_codebooks, frames]: the frames it spoke


def with_context(
    token_ids: list[int],
    frames: torch.Tensor,
    turn_start: int,
    turns: list[SpokenTurn],
    semantic_begin: int,
    turn_end: tuple[int, ...],
    room: int,
) -> tuple[list[int], torch.Tensor, int]:
    """A segment's prompt (``token_ids``, its ``frames`` [num_codebooks, n], all in the system turn)
    with the most recent of ``turns`` that fit in ``room`` tokens spliced in before its user turn
    at ``turn_start``: (token ids, frames, how many turns it carries)."""
    blocks: list[tuple[list[int], torch.Tensor]] = []
    size = len(token_ids)
    for turn in reversed(turns):
        ids = turn.turn_ids + [semantic_begin + int(c) for c in turn.codes[0]] + list(turn_end)
        if size + len(ids) > room:
            break
        blocks.insert(0, (ids, turn.codes.to(torch.int64)))
        size += len(ids)
    if not blocks:
        return token_ids, frames, 0
    ids = token_ids[:turn_start] + [t for block, _ in blocks for t in block] + token_ids[turn_start:]
    return ids, torch.cat([frames.to(torch.int64), *(codes for _, codes in blocks)], dim=1), len(blocks)


class SpokenSegments:
    """Per segment group, the turns of its segments that have ended, in order."""

    def __init__(self, keep: int):
        self.keep = keep
        self._groups: OrderedDict[str, list[SpokenTurn]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._groups)

    def before(self, segment: dict | None) -> list[SpokenTurn]:
        """The turns a segment's prompt may carry (none for a first or lone segment)."""
        if not segment or self.keep <= 0 or int(segment.get("index", 0)) == 0:
            return []
        return list(self._groups.get(str(segment.get("group")), []))

    def ended(self, segment: dict | None, turn: SpokenTurn) -> None:
        """A segment spoke ``turn``: kept for the next, unless it was its request's last."""
        if not segment or self.keep <= 0:
            return
        group = str(segment.get("group"))
        if int(segment.get("index", 0)) + 1 >= int(segment.get("count", 0)):
            self._groups.pop(group, None)
            return
        turns = self._groups.pop(group, [])
        turns.append(turn)
        self._groups[group] = turns[-self.keep :]
        while len(self._groups) > MAX_GROUPS:
            self._groups.popitem(last=False)

    def failed(self, segment: dict | None) -> None:
        """A segment ended without its frames (aborted, refused): its request is over."""
        if segment:
            self._groups.pop(str(segment.get("group")), None)
