"""Conversation items as OpenAI's Realtime API gives them (``conversation.item.create``'s
``item``, ``response.create``'s ``input``): messages of a ``user`` (``input_text``,
``input_audio``: base64 pcm16 at the session's input rate, ``input_image``: a data URL), a
``system`` (``input_text``) or an ``assistant`` (``output_text``, or ``output_audio`` by its
transcript), read into the chat parts a family's ``chat_inputs`` takes (audio as 16 kHz samples).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from omni_core.serve.errors import APIError
from omni_core.serve.realtime.input_audio import decode_pcm16
from omni_core.serve.realtime.session_config import as_object, refuse
from omni_core.serve.realtime.sockets import new_id
from omni_core.serve.realtime.vad import RATE
from omni_core.surface.audio_codecs import resample
from omni_core.surface.inputs import check_duration

PARTS = {
    "user": ("input_text", "input_audio", "input_image"),
    "system": ("input_text",),
    "assistant": ("output_text", "output_audio"),
}


@dataclass
class Item:
    id: str
    role: str
    parts: list[dict] = field(default_factory=list)  # chat parts: text, 16 kHz audio, image_url
    described: list[dict] = field(default_factory=list)  # the content as events give it back
    status: str = "completed"

    @property
    def text(self) -> str:
        return "".join(p["text"] for p in self.parts if p["type"] == "text")

    @property
    def audio_seconds(self) -> float:
        return sum(len(p["audio"]) / RATE for p in self.parts if p["type"] == "audio")

    def describe(self) -> dict:
        return {"id": self.id, "object": "realtime.item", "type": "message", "status": self.status,
                "role": self.role, "content": self.described}

    def message(self) -> dict:
        """The item as a chat message (``Omni.chat_inputs``)."""
        return {"role": self.role, "content": self.parts}


def audio_part(samples: np.ndarray) -> dict:
    return {"type": "audio", "audio": samples, "sample_rate": RATE}


def read_item(value, param: str, input_rate: int, limits, max_chars: int) -> Item:
    """An item of the client's, checked (``APIError`` naming the field that is wrong), with at
    most ``max_chars`` characters of text (a transcript given with its audio included)."""
    item = as_object(value, param)
    if item.get("type", "message") != "message":
        kind = item.get("type")
        raise refuse(f"{param}.type: only message items are served, not {kind!r}", f"{param}.type")
    role = item.get("role")
    if role not in PARTS:
        raise refuse(f"{param}.role must be user, system or assistant", f"{param}.role")
    item_id = item.get("id") or new_id("item")
    if not isinstance(item_id, str) or len(item_id) > 64:
        raise refuse(f"{param}.id must be a string of at most 64 characters", f"{param}.id")
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise refuse(f"{param}.content must be a list of content parts", f"{param}.content")
    out = Item(item_id, role)
    for index, part in enumerate(content):
        where = f"{param}.content[{index}]"
        part = as_object(part, where)
        kind = part.get("type")
        if kind not in PARTS[role]:
            takes = ", ".join(PARTS[role])
            raise refuse(f"{where}.type: a {role} message takes {takes}, not {kind!r}", f"{where}.type")
        if kind in ("input_text", "output_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise refuse(f"{where}.text must be a string", f"{where}.text")
            out.parts.append({"type": "text", "text": text})
            out.described.append({"type": kind, "text": text})
        elif kind == "output_audio":  # an assistant's audio enters the conversation as its words
            transcript = part.get("transcript")
            if not isinstance(transcript, str):
                raise refuse(f"{where}.transcript must be a string", f"{where}.transcript")
            out.parts.append({"type": "text", "text": transcript})
            out.described.append({"type": kind, "transcript": transcript})
        elif kind == "input_audio":
            samples = decode_pcm16(part.get("audio"))
            if not len(samples):
                raise refuse(f"{where}.audio holds no audio", f"{where}.audio")
            check_duration(samples, input_rate, limits, f"{where}.audio")  # 413 too_large, as over HTTP
            out.parts.append(audio_part(resample(samples, input_rate, RATE)))
            transcript = part.get("transcript")
            if transcript is not None and not isinstance(transcript, str):
                raise refuse(f"{where}.transcript must be a string", f"{where}.transcript")
            out.described.append({"type": kind, "transcript": transcript})
        else:  # input_image
            url = part.get("image_url")
            if not isinstance(url, str):
                raise refuse(f"{where}.image_url must be a data URL", f"{where}.image_url")
            detail = part.get("detail", "auto")
            if detail not in ("auto", "low", "high"):
                raise refuse(f"{where}.detail must be auto, low or high", f"{where}.detail")
            out.parts.append({"type": "image_url", "image_url": {"url": url}})
            out.described.append({"type": kind, "detail": detail})
    chars = len(out.text) + sum(len(part.get("transcript") or "") for part in out.described
                                if part["type"] == "input_audio")
    if chars > max_chars:
        raise APIError(413, f"{param} holds {chars} characters of text; the limit is {max_chars}",
                       param=param, code="too_large")
    return out
