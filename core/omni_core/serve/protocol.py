"""Request bodies of the OpenAI-shaped endpoints (pydantic v2), with omni's extensions.

Unknown fields are ignored, as OpenAI's own server does for forward compatibility; every known
field is checked and a bad one becomes a 400 naming the parameter.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class VoiceRef(_Body):
    id: str


INT64 = 1 << 63


class SamplingFields(_Body):
    seed: int | None = Field(None, ge=-INT64, lt=INT64)  # int64, as OpenAI's; larger ones overflowed a step
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0, lt=1 << 31)
    repetition_penalty: float | None = Field(None, gt=0.0)

    def sampling(self) -> dict[str, Any]:
        keys = ("temperature", "top_p", "top_k", "repetition_penalty")
        return {key: getattr(self, key) for key in keys if getattr(self, key) is not None}


class SpeechRequest(SamplingFields):
    model: str = Field(min_length=1)  # the served model's name (any other is a 404)
    input: str
    voice: str | VoiceRef | None = None
    response_format: str = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    stream_format: Literal["audio", "sse"] | None = None
    # extensions: zero-shot cloning from a reference clip (base64 or data URL) and its transcript
    reference_audio: str | None = None
    reference_text: str | None = None

    def voice_name(self) -> str | None:
        return self.voice.id if isinstance(self.voice, VoiceRef) else self.voice


class ChatAudioOptions(_Body):
    voice: str | VoiceRef | None = None
    format: Literal["wav", "mp3", "flac", "opus", "pcm16"] = "wav"


class StreamOptions(_Body):
    include_usage: bool = True


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None


StopString = Annotated[str, Field(min_length=1, max_length=256)]


class ChatRequest(SamplingFields):
    model: str = Field(min_length=1)  # the served model's name (any other is a 404)
    messages: list[ChatMessage] = Field(min_length=1)
    modalities: list[Literal["text", "audio"]] = Field(default_factory=lambda: ["text"])
    audio: ChatAudioOptions | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    # a string or up to 4, as OpenAI: the reply ends before the first of them
    stop: StopString | Annotated[list[StopString], Field(max_length=4)] | None = None

    def sampling(self) -> dict[str, Any]:
        params = super().sampling()
        limit = self.max_completion_tokens or self.max_tokens
        if limit is not None:
            params["max_tokens"] = limit
        if self.seed is not None:
            params["seed"] = self.seed
        if self.stop:
            params["stop"] = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return params


TRANSCRIPTION_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
