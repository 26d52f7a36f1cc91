"""A transcription session's settings and ``session.update``, in the shape of OpenAI's Realtime
API (``session.audio.input.{format, transcription, turn_detection, noise_reduction}``; the beta
API's flat ``input_audio_format``, ``input_audio_transcription`` and ``turn_detection`` too).

An update is all or nothing: a field it gets wrong is refused (``APIError``, sent as an ``error``
event) and the session keeps every setting it had.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

from omni_core.serve.errors import APIError
from omni_core.serve.realtime.turns import ServerVad

DEFAULT_RATE = 24000  # OpenAI's pcm rate; the session may name another
MIN_RATE, MAX_RATE = 8000, 48000


@dataclass
class SessionConfig:
    model: str
    rate: int = DEFAULT_RATE
    language: str | None = None
    prompt: str | None = None
    turn_detection: ServerVad | None = field(default_factory=ServerVad)

    def describe(self, session_id: str) -> dict:
        """The session as ``session.created`` and ``session.updated`` give it."""
        vad = self.turn_detection
        return {
            "type": "transcription",
            "id": session_id,
            "object": "realtime.transcription_session",
            "audio": {
                "input": {
                    "format": {"type": "audio/pcm", "rate": self.rate},
                    "transcription": {
                        "model": self.model,
                        "language": self.language,
                        "prompt": self.prompt or "",
                    },
                    "turn_detection": None
                    if vad is None
                    else {
                        "type": "server_vad",
                        "threshold": vad.threshold,
                        "prefix_padding_ms": vad.prefix_padding_ms,
                        "silence_duration_ms": vad.silence_duration_ms,
                    },
                    "noise_reduction": None,
                }
            },
            "include": [],
        }


def refuse(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def as_object(value, param: str) -> dict:
    if not isinstance(value, dict):
        raise refuse(f"{param} must be an object", param)
    return value


def read_number(settings: dict, key: str, param: str, low: float, high: float, integer: bool = False):
    value = settings[key]
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (integer and value != int(value)) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise refuse(f"{param}.{key} must be {kind} from {low:g} to {high:g}", f"{param}.{key}")
    return int(value) if integer else float(value)


def read_format(value, param: str) -> int:
    if value == "pcm16":  # the beta API's name: 24 kHz
        return DEFAULT_RATE
    fmt = as_object(value, param)
    if fmt.get("type") != "audio/pcm":
        raise refuse(
            f"{param}.type must be audio/pcm (16-bit little-endian mono), got {fmt.get('type')!r}", param
        )
    rate = fmt.get("rate", DEFAULT_RATE)
    if not isinstance(rate, int) or isinstance(rate, bool) or not MIN_RATE <= rate <= MAX_RATE:
        raise refuse(f"{param}.rate must be a sample rate from {MIN_RATE} to {MAX_RATE} Hz", f"{param}.rate")
    return rate


def _transcription(config: SessionConfig, value, param: str) -> None:
    if value is None:
        return
    settings = as_object(value, param)
    for key in ("language", "prompt"):
        text = settings.get(key)
        if text is not None and not isinstance(text, str):
            raise refuse(f"{param}.{key} must be a string", f"{param}.{key}")
    if "language" in settings:
        config.language = settings["language"] or None
    if "prompt" in settings:
        config.prompt = settings["prompt"] or None


def read_turn_detection(config: SessionConfig, value, param: str) -> None:
    if value is None:
        config.turn_detection = None
        return
    settings = as_object(value, param)
    kind = settings.get("type", "server_vad")
    if kind != "server_vad":
        raise refuse(
            f"{param}.type: only server_vad (or null: commit by hand) is served, not {kind!r}",
            f"{param}.type",
        )
    vad = copy.copy(config.turn_detection) or ServerVad()
    if settings.get("threshold") is not None:
        vad.threshold = read_number(settings, "threshold", param, 0.0, 1.0)
    if settings.get("prefix_padding_ms") is not None:
        vad.prefix_padding_ms = read_number(settings, "prefix_padding_ms", param, 0, 10000, integer=True)
    if settings.get("silence_duration_ms") is not None:
        vad.silence_duration_ms = read_number(settings, "silence_duration_ms", param, 0, 10000, integer=True)
    for key in ("create_response", "interrupt_response"):  # what a conversation session does at a turn
        if settings.get(key) is not None:
            if not isinstance(settings[key], bool):
                raise refuse(f"{param}.{key} must be true or false", f"{param}.{key}")
            setattr(vad, key, settings[key])
    config.turn_detection = vad


def updated(config: SessionConfig, session) -> SessionConfig:
    """``config`` with a ``session.update``'s ``session`` applied (a new object: nothing changes
    when a field is refused)."""
    session = as_object(session, "session")
    new = copy.deepcopy(config)
    kind = session.get("type", "transcription")
    if kind != "transcription":
        raise refuse(
            f"session.type: this session transcribes (its type is chosen when it opens), not {kind!r}",
            "session.type",
        )
    audio_input = as_object(
        as_object(session.get("audio", {}), "session.audio").get("input", {}), "session.audio.input"
    )
    if "format" in audio_input:
        new.rate = read_format(audio_input["format"], "session.audio.input.format")
    if "input_audio_format" in session:
        new.rate = read_format(session["input_audio_format"], "session.input_audio_format")
    if "transcription" in audio_input:
        _transcription(new, audio_input["transcription"], "session.audio.input.transcription")
    if "input_audio_transcription" in session:
        _transcription(new, session["input_audio_transcription"], "session.input_audio_transcription")
    if "turn_detection" in audio_input:
        read_turn_detection(new, audio_input["turn_detection"], "session.audio.input.turn_detection")
    if "turn_detection" in session:
        read_turn_detection(new, session["turn_detection"], "session.turn_detection")
    for where, settings in (("session.audio.input", audio_input), ("session", session)):
        key = "noise_reduction" if where != "session" else "input_audio_noise_reduction"
        if settings.get(key) is not None:
            raise refuse(f"{where}.{key}: noise reduction is not served; send null", f"{where}.{key}")
    return new
