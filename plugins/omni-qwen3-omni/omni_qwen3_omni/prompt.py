"""A chat as the thinker reads it: the checkpoint's chat template rendered with one placeholder
per media part, each placeholder expanded to as many tokens as its encoder gives rows, and the
multimodal rotary positions of every token.

Positions (Qwen3-Omni's rule): text and audio tokens advance one position each, on all three
axes (time, height, width); the tokens of an image or video frame grid share the time position
``start + t * seconds_per_grid * position_id_per_seconds`` and take their row and column (in
merged patches) on the other two axes; the token after a grid is one past the grid's largest
position. Without images or videos every axis is 0..L-1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .config import OmniCheckpoint

MEDIA_KINDS = ("audio", "image", "video")


@dataclass
class MediaItem:
    """One media part as the prompt sees it: its kind, how many placeholder rows it takes, and
    for images and videos its grid (t, h, w in patches) and seconds per temporal grid step."""

    kind: str
    rows: int
    grid: tuple[int, int, int] | None = None
    seconds_per_grid: float = 0.0


@dataclass
class Prompt:
    token_ids: list[int]
    rope_positions: torch.Tensor | None  # [3, L]; None when every axis is 0..L-1
    media: list[MediaItem] = field(default_factory=list)  # in prompt order


def template_messages(messages: list[dict]) -> list[dict]:
    """The entry payload's messages as the template takes them: text parts keep their text, media
    parts become ``{"type": "audio" | "image" | "video"}`` (the template writes their placeholder)."""
    out = []
    for message in messages:
        parts = []
        for part in message["content"]:
            kind = part["type"]
            parts.append({"type": "text", "text": part["text"]} if kind == "text" else {"type": kind})
        role = "system" if message["role"] == "developer" else message["role"]
        out.append({"role": role, "content": parts})
    return out


def render(checkpoint: OmniCheckpoint, tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of the chat with one pad token per media part and the assistant's turn opened."""
    text = tokenizer.apply_chat_template(
        template_messages(messages), chat_template=checkpoint.chat_template, add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(text, add_special_tokens=False)


def expand(checkpoint: OmniCheckpoint, ids: list[int], media: list[MediaItem]) -> Prompt:
    """Each media part's pad token repeated ``rows`` times (parts in prompt order) and the
    tokens' rotary positions."""
    kind_of = _pad_kinds(checkpoint)
    placeholders = [kind_of[t] for t in ids if t in kind_of]
    if placeholders != [m.kind for m in media]:
        raise ValueError(f"the chat template wrote media placeholders {placeholders}, the messages hold {[m.kind for m in media]}")
    out: list[int] = []
    items = iter(media)
    for token in ids:
        out.extend([token] * (next(items).rows if token in kind_of else 1))
    return Prompt(out, rope_positions(checkpoint, out, media), list(media))


def _pad_kinds(checkpoint: OmniCheckpoint) -> dict[int, str]:
    tokens = checkpoint.tokens
    return {tokens.audio: "audio", tokens.image: "image", tokens.video: "video"}


def rope_positions(checkpoint: OmniCheckpoint, ids: list[int], media: list[MediaItem]) -> torch.Tensor | None:
    """[3, L] rotary positions of expanded ids whose media parts are ``media`` (in order, each a
    run of ``rows`` pad tokens); None when every axis is 0..L-1 (no image or video)."""
    kind_of = _pad_kinds(checkpoint)
    position_rows: list[torch.Tensor] = []
    next_pos = 0
    linear = 0  # tokens since the last grid: text and audio rows take one position each, on every axis
    items = iter(media)
    i = 0
    while i < len(ids):
        item = next(items) if ids[i] in kind_of else None
        step = item.rows if item else 1
        i += step
        if item is None or item.kind == "audio":
            linear += step
            continue
        position_rows.append(torch.arange(next_pos, next_pos + linear).expand(3, -1))
        grid = grid_positions(item, checkpoint.vision.merge_size, checkpoint.position_id_per_seconds) + next_pos + linear
        position_rows.append(grid)
        next_pos, linear = int(grid.max()) + 1, 0
    if not position_rows:
        return None
    position_rows.append(torch.arange(next_pos, next_pos + linear).expand(3, -1))
    return torch.cat(position_rows, dim=1)


def grid_positions(item: MediaItem, merge: int, position_id_per_seconds: float) -> torch.Tensor:
    """[3, rows] (time, row, column) of a grid's merged tokens, frame after frame, row-major."""
    t, h, w = item.grid
    h, w = h // merge, w // merge
    # an image's single step is at time 0; a video's step k at k seconds (in position ids)
    times = torch.tensor([round(k * item.seconds_per_grid * position_id_per_seconds) for k in range(t)], dtype=torch.int64)
    time = times.view(t, 1, 1).expand(t, h, w)
    row = torch.arange(h).view(1, h, 1).expand(t, h, w)
    col = torch.arange(w).view(1, 1, w).expand(t, h, w)
    return torch.stack([time.reshape(-1), row.reshape(-1), col.reshape(-1)])


def media_index(ids: list[int], checkpoint: OmniCheckpoint) -> tuple[torch.Tensor, torch.Tensor]:
    """(row of the media rows each position takes or -1, row of the visual deepstack rows or -1)."""
    tokens = checkpoint.tokens
    ids_t = torch.tensor(ids, dtype=torch.int64)
    media = (ids_t == tokens.audio) | (ids_t == tokens.image) | (ids_t == tokens.video)
    visual = (ids_t == tokens.image) | (ids_t == tokens.video)
    index = torch.where(media, media.long().cumsum(0) - 1, torch.full_like(ids_t, -1))
    deep = torch.where(visual, visual.long().cumsum(0) - 1, torch.full_like(ids_t, -1))
    return index, deep
