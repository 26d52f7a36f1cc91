"""The settings of a speech or conversation session (``session.type: "realtime"``) and
``session.update``, in the shape of OpenAI's Realtime API: ``instructions``,
``output_modalities``, ``max_output_tokens``, ``audio.input.{format, turn_detection}`` and
``audio.output.{format, voice, speed}``.

An update is all or nothing: a field it gets wrong is refused (``APIError``, sent as an ``error``
event) and the session keeps every setting it had. Whether the voice exists is the session's to
check (it needs the served model).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

from omni_core.serve.realtime.session_config import (
    DEFAULT_RATE,
    as_object,
    read_format,
    read_number,
    read_turn_detection,
    refuse,
)
from omni_core.serve.realtime.turns import ServerVad

SPEECH, CONVERSATION = "speech", "conversation"
MIN_SPEED, MAX_SPEED = 0.25, 4.0  # as POST /v1/audio/speech


@dataclass
class RealtimeConfig:
    model: str
    mode: str  # SPEECH (text in, speech out) or CONVERSATION (audio and text in and out)
    rate: int = DEFAULT_RATE  # input audio
    output_rate: int = DEFAULT_RATE
    voice: str | None = None
    speed: float = 1.0
    instructions: str | None = None
    output_modalities: list[str] = field(default_factory=lambda: ["audio"])
    max_output_tokens: int | None = None  # None: as many as the model gives ("inf")
    turn_detection: ServerVad | None = None

    def describe(self, session_id: str) -> dict:
        """The session as ``session.created`` and ``session.updated`` give it."""
        vad = self.turn_detection
        return {
            "type": "realtime",
            "id": session_id,
            "object": "realtime.session",
            "model": self.model,
            "instructions": self.instructions or "",
            "output_modalities": list(self.output_modalities),
            "max_output_tokens": "inf" if self.max_output_tokens is None else self.max_output_tokens,
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.rate},
                    "transcription": None,
                    "noise_reduction": None,
                    "turn_detection": None
                    if vad is None
                    else {
                        "type": "server_vad",
                        "threshold": vad.threshold,
                        "prefix_padding_ms": vad.prefix_padding_ms,
                        "silence_duration_ms": vad.silence_duration_ms,
                        "create_response": vad.create_response,
                        "interrupt_response": vad.interrupt_response,
                    },
                },
                "output": {
                    "format": {"type": "audio/pcm", "rate": self.output_rate},
                    "voice": self.voice,
                    "speed": self.speed,
                },
            },
            "tools": [],
            "tool_choice": "auto",
        }


def read_voice(value, param: str) -> str | None:
    """A voice as OpenAI names one: a string, or ``{"id": ...}`` for a custom (saved) voice."""
    if isinstance(value, dict):
        value = value.get("id")
    if value is not None and (not isinstance(value, str) or not value):
        raise refuse(f"{param} must be a voice name or {{\"id\": name}}", param)
    return value


def read_modalities(value, mode: str, param: str) -> list[str]:
    allowed = (["audio"],) if mode == SPEECH else (["audio"], ["text"])
    if value not in allowed:
        what = '["audio"]' if mode == SPEECH else '["audio"] (speech with its transcript) or ["text"]'
        raise refuse(f"{param} must be {what}", param)
    return list(value)


def read_max_tokens(value, where: str) -> int | None:
    """``max_output_tokens`` of the session or of a response (``where``): a count or "inf"."""
    if value == "inf" or value is None:
        return None
    return read_number({"max_output_tokens": value}, "max_output_tokens", where, 1, 1 << 20, integer=True)


def updated(config: RealtimeConfig, session) -> RealtimeConfig:
    """``config`` with a ``session.update``'s ``session`` applied (a new object)."""
    session = as_object(session, "session")
    new = copy.deepcopy(config)
    kind = session.get("type", "realtime")
    if kind != "realtime":
        raise refuse(
            f"session.type: this is a {config.mode} session, of type realtime (its type is chosen when it "
            f"opens: ?intent=transcription asks for a transcription session), not {kind!r}",
            "session.type",
        )
    audio = as_object(session.get("audio") or {}, "session.audio")
    audio_input = as_object(audio.get("input") or {}, "session.audio.input")
    audio_output = as_object(audio.get("output") or {}, "session.audio.output")
    if "format" in audio_input:
        new.rate = read_format(audio_input["format"], "session.audio.input.format")
    if "turn_detection" in audio_input:
        param = "session.audio.input.turn_detection"
        if config.mode == SPEECH and audio_input["turn_detection"] is not None:
            raise refuse(f"{param}: a speech session takes text, not audio: send null", param)
        read_turn_detection(new, audio_input["turn_detection"], param)
    for key in ("transcription", "noise_reduction"):
        if audio_input.get(key) is not None:
            raise refuse(
                f"session.audio.input.{key} is not served in {config.mode} sessions; send null",
                f"session.audio.input.{key}",
            )
    if "format" in audio_output:
        new.output_rate = read_format(audio_output["format"], "session.audio.output.format")
    if "voice" in audio_output:
        new.voice = read_voice(audio_output["voice"], "session.audio.output.voice")
    if audio_output.get("speed") is not None:
        new.speed = read_number(audio_output, "speed", "session.audio.output", MIN_SPEED, MAX_SPEED)
    if "instructions" in session:
        instructions = session["instructions"]
        if instructions is not None and not isinstance(instructions, str):
            raise refuse("session.instructions must be a string", "session.instructions")
        new.instructions = instructions or None
    if "output_modalities" in session:
        new.output_modalities = read_modalities(
            session["output_modalities"], config.mode, "session.output_modalities"
        )
    if "max_output_tokens" in session:
        new.max_output_tokens = read_max_tokens(session["max_output_tokens"], "session")
    return new
