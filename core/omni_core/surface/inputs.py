"""Entry payloads the serving layer sends to a family (docs/architecture.md, "Task inputs and
outputs"), built and checked in one place for the HTTP server and the offline ``Omni`` API.

Everything here is family-agnostic: audio is decoded and resampled to the family's input rate,
limits are enforced, and a bad value raises ``InvalidInput`` naming the parameter.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from omni_core.hooks import InputTooLarge, InvalidInput
from omni_core.surface.audio_codecs import check_seconds, decode_audio, decode_base64, resample


@dataclass
class Limits:
    max_input_chars: int = 4096  # speech input and chat text, as OpenAI's speech endpoint
    max_audio_seconds: float = 600.0  # any audio a request brings (uploads, references, chat audio)
    max_upload_mb: float = 25.0  # raw request size of uploads, as OpenAI's transcription endpoint


def load_audio(audio: Any, sample_rate: int | None, param: str, max_seconds: float | None = None) -> tuple[np.ndarray, int]:
    """A path, encoded bytes, or samples with their ``sample_rate`` -> float32 mono and rate;
    encoded audio longer than ``max_seconds`` is refused while it decodes (``decode_audio``)."""
    if isinstance(audio, (str, os.PathLike)):
        path = Path(audio)
        if not path.is_file():
            raise InvalidInput(f"{param}: no such file {str(path)!r}", param)
        audio = path.read_bytes()
    if isinstance(audio, (bytes, bytearray, memoryview)):
        return decode_audio(bytes(audio), max_seconds, param)
    if isinstance(audio, torch.Tensor):
        audio = audio.detach().cpu().numpy()
    samples = np.asarray(audio, dtype=np.float32)
    if sample_rate is None:
        raise InvalidInput(f"{param}: raw samples need their sample_rate", param)
    if samples.ndim == 2:  # (channels, n) or (n, channels): mix down along the short axis
        samples = samples.mean(axis=0 if samples.shape[0] < samples.shape[1] else 1)
    if samples.ndim != 1 or samples.size == 0:
        raise InvalidInput(f"{param}: expected mono or stereo samples, got shape {samples.shape}", param)
    return np.ascontiguousarray(samples), int(sample_rate)


def check_duration(samples: np.ndarray, rate: int, limits: Limits, param: str) -> None:
    check_seconds(len(samples) / rate, limits.max_audio_seconds, param)


def check_text(text: str, limits: Limits, param: str) -> str:
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"{param} must be a non-empty string", param)
    return check_optional_text(text, limits, param)


def check_optional_text(text: str | None, limits: Limits, param: str) -> str | None:
    """A text field that may be absent: at most ``max_input_chars`` (each is tokenized and
    embedded with the request, so none may be unbounded) and valid Unicode (JSON can carry
    lone surrogates, which no tokenizer takes)."""
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidInput(f"{param} must be a string", param)
    if len(text) > limits.max_input_chars:
        raise InputTooLarge(f"{param} has {len(text)} characters; the limit is {limits.max_input_chars}", param)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"{param} is not valid Unicode (it holds a lone surrogate)", param) from None
    return text


def chat_text_chars(limits: Limits) -> int:
    """The most chat text, a message's and all of a request's: 8 times a speech input."""
    return limits.max_input_chars * 8


def _chat_text_limits(limits: Limits) -> Limits:
    return Limits(max_input_chars=chat_text_chars(limits))


def _tensor(samples: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(samples, dtype=np.float32))


def speech_inputs(
    text: str,
    *,
    voice: str | None,
    reference: tuple[np.ndarray, int] | None,
    reference_text: str | None,
    instructions: str | None,
    speed: float,
    seed: int | None,
    sampling: dict[str, Any],
    limits: Limits,
) -> dict[str, Any]:
    check_text(text, limits, "input")
    check_optional_text(instructions, limits, "instructions")
    check_optional_text(reference_text, limits, "reference_text")
    if not 0.25 <= speed <= 4.0:
        raise InvalidInput("speed must be between 0.25 and 4.0", "speed")
    inputs: dict[str, Any] = {
        "task": "speech",
        "text": text,
        "voice": voice,
        "instructions": instructions,
        "speed": float(speed),
        "seed": seed,
        "sampling": dict(sampling),
        "reference_audio": None,
        "reference_sample_rate": None,
        "reference_text": reference_text,
    }
    if reference is not None:
        samples, rate = reference
        check_duration(samples, rate, limits, "reference_audio")
        inputs["reference_audio"] = _tensor(samples)
        inputs["reference_sample_rate"] = int(rate)
    return inputs


def transcription_inputs(
    samples: np.ndarray,
    rate: int,
    *,
    target_rate: int | None,
    language: str | None,
    prompt: str | None,
    temperature: float,
    timestamps: bool,
    limits: Limits,
    task: str = "transcription",
    word_timestamps: bool = False,
) -> dict[str, Any]:
    """The entry payload of a transcription, or of a translation (``task="translation"``: the
    text comes out in English; ``language`` is then the speech's)."""
    check_duration(samples, rate, limits, "file")
    if not 0.0 <= temperature <= 1.0:
        raise InvalidInput("temperature must be between 0 and 1", "temperature")
    return {
        "task": task,
        "audio": _tensor(resample(samples, rate, target_rate)),
        "language": language or None,
        "prompt": prompt or None,
        "temperature": float(temperature),
        "timestamps": bool(timestamps),
        "word_timestamps": bool(word_timestamps),  # segments carry "words" where the family can
    }


LOCAL_PART_TYPES = ("audio", "image", "video")  # the offline API's parts: samples, bytes or file paths


def _chat_part(part: Any, where: str, target_rate: int | None, limits: Limits, local_parts: bool) -> dict[str, Any]:
    if not isinstance(part, dict) or "type" not in part:
        raise InvalidInput(f"{where} must be an object with a 'type'", where)
    kind = part["type"]
    if kind in LOCAL_PART_TYPES and not local_parts:
        # over HTTP only the OpenAI-shaped parts: a local one would have the server read its own files
        raise InvalidInput(f"{where}: unsupported content part type {kind!r}", f"{where}.type")
    if kind == "text":
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidInput(f"{where}.text must be a string", f"{where}.text")
        check_optional_text(text, _chat_text_limits(limits), f"{where}.text")
        return {"type": "text", "text": text}
    if kind == "input_audio":
        spec = part.get("input_audio") or {}
        data = spec.get("data") if isinstance(spec, dict) else None
        if not isinstance(data, str):
            raise InvalidInput(f"{where}.input_audio.data must be base64 audio", f"{where}.input_audio.data")
        samples, rate = load_audio(
            decode_base64(data, f"{where}.input_audio.data"), None, f"{where}.input_audio", limits.max_audio_seconds
        )
        return {"type": "audio", "audio": _tensor(resample(samples, rate, target_rate))}
    if kind == "audio":  # offline API: samples (or a path / bytes) given directly
        samples, rate = load_audio(part.get("audio"), part.get("sample_rate"), f"{where}.audio", limits.max_audio_seconds)
        check_duration(samples, rate, limits, f"{where}.audio")
        return {"type": "audio", "audio": _tensor(resample(samples, rate, target_rate))}
    if kind == "image_url":
        spec = part.get("image_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise InvalidInput(f"{where}.image_url.url must be a data URL", f"{where}.image_url")
        return {"type": "image", "image": decode_base64(url, f"{where}.image_url.url")}
    if kind == "image":
        image = part.get("image")
        if not isinstance(image, (bytes, bytearray)):
            raise InvalidInput(f"{where}.image must be encoded image bytes", f"{where}.image")
        return {"type": "image", "image": bytes(image)}
    if kind == "video_url":  # vLLM's part for video: a data URL (the server fetches nothing)
        spec = part.get("video_url")
        url = spec.get("url") if isinstance(spec, dict) else spec
        if not isinstance(url, str):
            raise InvalidInput(f"{where}.video_url.url must be a data URL", f"{where}.video_url")
        return {"type": "video", "video": decode_base64(url, f"{where}.video_url.url")}
    if kind == "video":  # offline API: encoded bytes or a path
        video = part.get("video")
        if isinstance(video, (str, os.PathLike)) and Path(video).is_file():
            video = Path(video).read_bytes()
        if not isinstance(video, (bytes, bytearray)):
            raise InvalidInput(f"{where}.video must be encoded video bytes or a file path", f"{where}.video")
        return {"type": "video", "video": bytes(video)}
    raise InvalidInput(f"{where}: unsupported content part type {kind!r}", f"{where}.type")


def chat_inputs(
    messages: list[dict[str, Any]],
    *,
    target_rate: int | None,
    modalities: list[str],
    voice: str | None,
    reference: tuple[np.ndarray, int] | None,
    reference_text: str | None,
    sampling: dict[str, Any],
    limits: Limits,
    local_parts: bool = True,
) -> dict[str, Any]:
    """``local_parts``: whether parts may be the offline API's ``audio`` / ``image`` / ``video``
    (samples, bytes, file paths); the HTTP server takes only OpenAI's part types."""
    if not messages:
        raise InvalidInput("messages must not be empty", "messages")
    check_optional_text(reference_text, limits, "reference_text")
    converted = []
    chars = 0
    for i, message in enumerate(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise InvalidInput(
                f"messages[{i}].role must be system, developer, user, assistant or tool",
                f"messages[{i}].role",
            )
        content = message.get("content")
        if content is None:
            parts = []
        elif isinstance(content, str):
            check_optional_text(content, _chat_text_limits(limits), f"messages[{i}].content")
            parts = [{"type": "text", "text": content}]
        elif isinstance(content, list):
            parts = [
                _chat_part(p, f"messages[{i}].content[{j}]", target_rate, limits, local_parts)
                for j, p in enumerate(content)
            ]
        else:
            raise InvalidInput(
                f"messages[{i}].content must be a string or a list of parts", f"messages[{i}].content"
            )
        chars += sum(len(p["text"]) for p in parts if p["type"] == "text")
        converted.append({"role": role, "content": parts})
    most = _chat_text_limits(limits).max_input_chars
    if chars > most:
        raise InputTooLarge(f"messages hold {chars} characters of text; the limit is {most}", "messages")
    if any(m not in ("text", "audio") for m in modalities) or "text" not in modalities:
        raise InvalidInput('modalities must be ["text"] or ["text", "audio"]', "modalities")
    inputs: dict[str, Any] = {
        "task": "chat",
        "messages": converted,
        "modalities": list(modalities),
        "voice": voice,
        "sampling": dict(sampling),
        "reference_audio": None,
        "reference_sample_rate": None,
        "reference_text": reference_text,
    }
    if reference is not None:
        inputs["reference_audio"] = _tensor(reference[0])
        inputs["reference_sample_rate"] = int(reference[1])
    return inputs
