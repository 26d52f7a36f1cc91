"""The offline Python API: ``Omni`` runs a family's stage pipeline in this process.

```python
from omni_core import Omni
with Omni(family=NAME, preset="tiny") as omni:      # any installed family (`omni families`)
    result = omni.speech("Hello there", voice=VOICE)   # result.audio (float32), result.sample_rate
```

The HTTP server is a thin layer over the same object: it builds the same entry payloads
(``omni_core.surface.inputs``) and reads the same terminal outputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omni_core.hooks import FamilySpec, InvalidInput, Voice, check_option_names, get_plugin_manager
from omni_core.surface import inputs as build
from omni_core.surface.checkpoints import CheckpointNotFound, resolve_checkpoint
from omni_core.surface.inputs import Limits, load_audio
from omni_core.surface.voices_store import SavedVoice, VoiceStore


@dataclass
class SpeechResult:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass
class TranscriptionResult:
    text: str
    language: str | None = None
    duration: float | None = None
    segments: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatResult:
    text: str
    audio: np.ndarray | None = None
    sample_rate: int | None = None
    usage: dict[str, Any] = field(default_factory=dict)


@dataclass
class ChatDelta:
    """One streamed piece of a chat reply: a text delta or an audio chunk."""

    text: str = ""
    audio: np.ndarray | None = None


__all__ = [
    "ChatDelta",
    "ChatResult",
    "CheckpointNotFound",
    "Omni",
    "SpeechResult",
    "TranscriptionResult",
    "resolve_checkpoint",
]


def to_numpy(audio: Any) -> np.ndarray:
    if hasattr(audio, "detach"):
        audio = audio.detach().to("cpu").float().numpy()
    return np.asarray(audio, dtype=np.float32).reshape(-1)


def build_named(build, family: str, checkpoint_dir: str, options: dict[str, Any]):
    """The family's topology, named after the family (stages and plugins' stage hooks learn the
    family from it); module-level, so a stage process can get it pickled."""
    topology = build(checkpoint_dir, options)
    topology.name = family
    return topology


def topology_builder(spec: FamilySpec, checkpoint_dir: str, options: dict[str, Any]):
    """The callable that builds the family's topology here and again in every stage process."""
    return functools.partial(build_named, spec.build, spec.name, checkpoint_dir, options)


class Omni:
    """One family's pipeline, started on construction and stopped by ``shutdown`` (or ``with``)."""

    def __init__(
        self,
        family: str,
        model: str | None = None,
        preset: str | None = None,
        *,
        device: str = "auto",
        stage_mode: str = "inproc",
        placement: dict[str, str] | None = None,
        stage_devices: dict[str, str] | None = None,
        ray: Any = None,
        options: dict[str, Any] | None = None,
        voices_dir: str | None = None,
        limits: Limits | None = None,
        cache_dir: str | None = None,
        plugin_manager: Any = None,
        checkpoint_dir: str | None = None,
        progress: Callable[[str], None] | None = None,
    ):
        say = progress or (lambda message: None)
        self.plugin_manager = plugin_manager or get_plugin_manager()
        self.spec: FamilySpec = self.plugin_manager.family(family)
        self.family = self.spec.name
        check_option_names(self.spec, options or {})
        self.limits = limits or Limits()
        self.voice_store = VoiceStore(voices_dir) if voices_dir else None
        say(f"resolving checkpoint of {self.family}")
        self.checkpoint_dir = checkpoint_dir or resolve_checkpoint(self.spec, model, preset, cache_dir)
        self.device = self._device(device)
        self.options = dict(options or {})
        say(f"building the {self.family} topology from {self.checkpoint_dir}")
        rebuild = topology_builder(self.spec, self.checkpoint_dir, self.options)
        topology = rebuild()
        from omni_core.pipeline import Pipeline, TopologyError

        for stage_name, stage_device in (stage_devices or {}).items():
            try:
                topology.stage(stage_name).device = stage_device
            except TopologyError as exc:
                raise ValueError(f"stage device: {exc}") from None
        self.pipeline = Pipeline(
            topology,
            stage_mode=stage_mode,
            placement=placement,
            device=self.device,
            plugin_manager=self.plugin_manager,
            rebuild=rebuild,
            ray=ray,  # a RayOptions for stages placed on Ray
        )
        names = ", ".join(stage.name for stage in topology.stages)
        say(f"starting {len(topology.stages)} stages on {self.device} ({stage_mode}): {names}")
        self.pipeline.start(progress=say)  # a line as each stage is ready: loading weights takes the time
        self._builtin_voices = list(self.spec.voices(self.checkpoint_dir)) if self.spec.voices else []
        self.tasks = self._tasks()
        if self.spec.split_speech is not None:  # it loads what it needs (a tokenizer) now, not on a request
            self.spec.split_speech(self.checkpoint_dir, {"task": "speech", "text": "Ready."})
        say("ready")

    def _device(self, device: str) -> str:
        from omni_core.platforms.select import resolve_platform

        platform = resolve_platform(device, self.plugin_manager)  # refuses a device missing or unusable here
        return device if ":" in device else platform.device()  # an explicit device such as xpu:1 as given

    # -- lifecycle --------------------------------------------------------------------------------

    def shutdown(self) -> None:
        self.pipeline.shutdown()

    def __enter__(self) -> Omni:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def stats(self) -> dict[str, Any]:
        return self.pipeline.stats()

    @property
    def unavailable(self) -> str | None:
        """Why no request can run now (the Ray cluster of its stages unreachable or lost), else None."""
        return self.pipeline.unavailable

    @property
    def lost(self) -> str | None:
        """Why no request can ever run again (the Ray cluster of its stages lost), else None."""
        return self.pipeline.lost

    # -- voices -----------------------------------------------------------------------------------

    def builtin_voices(self) -> list[Voice]:
        return list(self._builtin_voices)

    def resolve_voice(
        self, voice: str | None, param: str = "voice"
    ) -> tuple[str | None, tuple | None, str | None]:
        """``(built-in voice id, reference (samples, rate), reference text)`` for a voice name."""
        if voice is None:
            return None, None, None
        for builtin in self._builtin_voices:
            if voice in (builtin.id, builtin.name):
                return builtin.id, None, None
        saved = self.voice_store.find(voice) if self.voice_store else None
        if saved is not None:
            return None, self.voice_store.load_audio(saved), saved.text
        known = [v.id for v in self._builtin_voices] + [
            v.name for v in (self.voice_store.list() if self.voice_store else [])
        ]
        raise InvalidInput(
            f"unknown voice {voice!r}; available: {', '.join(known) or 'none'}", param, code="unknown_voice"
        )

    def save_voice(
        self, name: str, audio: Any, sample_rate: int | None = None, text: str = "", *, param: str = "audio"
    ) -> SavedVoice:
        """Saves a reference clip (a path, encoded bytes, or samples with their ``sample_rate``)
        and its transcript as a voice of ``voices_dir``. A clip the family could never clone from
        (``FamilySpec.reference_limits``) raises ``InvalidInput`` naming the limits; a name that
        is taken or malformed raises ``VoiceStoreError``."""
        if self.voice_store is None:
            raise InvalidInput("voices need a voices directory (voices_dir, --voices-dir)", code="voices_disabled")
        samples, rate = load_audio(audio, sample_rate, param, self.limits.max_audio_seconds)
        limits = self.spec.reference_limits
        problem = limits.problem(len(samples) / rate, rate) if limits is not None else None
        if problem:
            raise InvalidInput(f"{self.family}: {problem}", param, code="unusable_reference")
        reserved = {v.id for v in self._builtin_voices} | {v.name for v in self._builtin_voices}
        return self.voice_store.save(name, samples, rate, text, reserved)

    def _tasks(self) -> tuple[str, ...]:
        """What this checkpoint does: the family's tasks, or those its ``checkpoint_tasks`` names."""
        if self.spec.checkpoint_tasks is None:
            return tuple(self.spec.tasks)
        done = set(self.spec.checkpoint_tasks(self.checkpoint_dir))
        return tuple(task for task in self.spec.tasks if task in done)

    def _require(self, task: str) -> None:
        if task not in self.tasks:
            doing = f"{self.family!r} with this checkpoint" if task in self.spec.tasks else repr(self.family)
            raise InvalidInput(
                f"family {doing} does not do {task}; it does {', '.join(self.tasks)}",
                "model",
                "unsupported_task",
            )

    # -- payloads (shared with the HTTP server) ---------------------------------------------------

    def speech_inputs(
        self,
        text: str,
        voice: str | None = None,
        *,
        reference_audio: Any = None,
        reference_sample_rate: int | None = None,
        reference_text: str | None = None,
        instructions: str | None = None,
        speed: float = 1.0,
        seed: int | None = None,
        sampling: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        self._require("speech")
        reference = None
        if reference_audio is not None:
            reference = load_audio(reference_audio, reference_sample_rate, "reference_audio", self.limits.max_audio_seconds)
            voice_id = None
        else:
            voice_id, reference, saved_text = self.resolve_voice(voice)
            reference_text = reference_text or saved_text
        return build.speech_inputs(
            text,
            voice=voice_id,
            reference=reference,
            reference_text=reference_text,
            instructions=instructions,
            speed=speed,
            seed=seed,
            sampling=sampling or {},
            limits=self.limits,
        )

    def transcription_inputs(
        self,
        audio: Any,
        sample_rate: int | None = None,
        *,
        language: str | None = None,
        prompt: str | None = None,
        temperature: float = 0.0,
        timestamps: bool = False,
        task: str = "transcription",
        word_timestamps: bool = False,
    ) -> dict[str, Any]:
        """The entry payload of a transcription (or, with ``task="translation"``, of a translation
        into English; ``language`` is the speech's, detected where the family can when unset)."""
        if task not in ("transcription", "translation"):
            raise InvalidInput(f"task must be transcription or translation, not {task!r}", "task")
        self._require(task)
        samples, rate = load_audio(audio, sample_rate, "file", self.limits.max_audio_seconds)
        return build.transcription_inputs(
            samples,
            rate,
            target_rate=self.spec.input_sample_rate,
            language=language,
            prompt=prompt,
            temperature=temperature,
            timestamps=timestamps,
            limits=self.limits,
            task=task,
            word_timestamps=word_timestamps,
        )

    def chat_inputs(
        self,
        messages: list[dict[str, Any]],
        *,
        modalities: list[str] | tuple[str, ...] = ("text",),
        voice: str | None = None,
        sampling: dict[str, Any] | None = None,
        local_parts: bool = True,
    ) -> dict[str, Any]:
        """The chat's entry payload; ``local_parts=False`` (the server) refuses the offline-only
        parts that take samples, bytes or file paths."""
        self._require("chat")
        voice_id, reference, reference_text = (
            self.resolve_voice(voice) if "audio" in modalities else (None, None, None)
        )
        return build.chat_inputs(
            messages,
            target_rate=self.spec.input_sample_rate,
            modalities=list(modalities),
            voice=voice_id,
            reference=reference,
            reference_text=reference_text,
            sampling=sampling or {},
            limits=self.limits,
            local_parts=local_parts,
        )

    def submit(self, inputs: dict[str, Any], request_id: str | None = None, deadline: float | None = None):
        """Start a request from an entry payload; returns the pipeline's ``RequestHandle``, or for
        a speech request the family cuts into segments (``FamilySpec.split_speech``) a
        ``SegmentedHandle`` that runs them in turn and yields their events as one request's.
        ``deadline`` (``time.monotonic()``): past it the request stops (``DeadlineExceeded``)."""
        split = self.spec.split_speech
        parts = split(self.checkpoint_dir, inputs) if split is not None and inputs.get("task") == "speech" else None
        if parts and len(parts) > 1:
            from omni_core.pipeline import SegmentedHandle

            ahead = 0 if self.spec.segments_in_turn else 1
            return SegmentedHandle(self.pipeline, parts, request_id, ahead=ahead, deadline=deadline)
        return self.pipeline.submit(inputs, request_id=request_id, deadline=deadline)

    # -- tasks ------------------------------------------------------------------------------------

    def speech(self, text: str, voice: str | None = None, *, stream: bool = False, **kwargs):
        """Synthesize ``text``. Returns a ``SpeechResult``, or with ``stream=True`` an iterator of
        float32 chunks (deltas, at ``self.sample_rate``). Keyword arguments as ``speech_inputs``."""
        handle = self.submit(self.speech_inputs(text, voice, **kwargs))
        if stream:
            return self._audio_chunks(handle)
        usage: dict[str, Any] = {}
        parts = list(self._audio_chunks(handle, usage))
        audio = np.concatenate(parts) if parts else np.zeros(0, np.float32)
        return SpeechResult(audio, self.sample_rate, usage)

    def _audio_chunks(self, handle, usage: dict | None = None) -> Iterator[np.ndarray]:
        try:
            for event in handle:
                if event.name != "audio":
                    continue
                if "audio" in event.payload:
                    yield to_numpy(event.payload["audio"])
                if usage is not None and event.payload.get("usage"):
                    usage.update(event.payload["usage"])
        finally:
            if not handle.done:  # the caller stopped early: free the request everywhere
                handle.abort()

    @property
    def sample_rate(self) -> int | None:
        return self.spec.sample_rate

    def transcribe(self, audio: Any, sample_rate: int | None = None, *, stream: bool = False, **kwargs):
        """Transcribe a path, encoded bytes, or samples (with ``sample_rate``). Returns a
        ``TranscriptionResult``, or with ``stream=True`` an iterator of text deltas."""
        return self._text_of(self.transcription_inputs(audio, sample_rate, **kwargs), stream)

    def translate(self, audio: Any, sample_rate: int | None = None, *, stream: bool = False, **kwargs):
        """Speech in another language to English text; as ``transcribe`` otherwise (its
        ``language``, when given, is the speech's)."""
        return self._text_of(self.transcription_inputs(audio, sample_rate, task="translation", **kwargs), stream)

    def _text_of(self, inputs: dict[str, Any], stream: bool):
        handle = self.submit(inputs)
        if stream:
            return self._text_deltas(handle, {})
        final: dict[str, Any] = {}
        for _ in self._text_deltas(handle, final):
            pass
        return TranscriptionResult(
            text=final.get("text", ""),
            language=final.get("language"),
            duration=final.get("duration"),
            segments=list(final.get("segments") or []),
            usage=dict(final.get("usage") or {}),
        )

    def _text_deltas(self, handle, final: dict) -> Iterator[str]:
        try:
            for event in handle:
                if event.name != "text":
                    continue
                if event.end:
                    final.update(event.payload)
                elif event.payload.get("text"):
                    yield event.payload["text"]
        finally:
            if not handle.done:
                handle.abort()

    def chat(
        self,
        messages: list[dict[str, Any]],
        *,
        modalities: list[str] | tuple[str, ...] = ("text",),
        voice: str | None = None,
        sampling: dict[str, Any] | None = None,
        stream: bool = False,
    ):
        """Reply to OpenAI-style ``messages`` (text, ``input_audio``, ``image_url`` parts, or
        ``{"type": "audio", "audio": samples, "sample_rate": sr}``). Returns a ``ChatResult``, or
        with ``stream=True`` an iterator of ``ChatDelta``."""
        handle = self.submit(
            self.chat_inputs(messages, modalities=modalities, voice=voice, sampling=sampling)
        )
        if stream:
            return self._chat_deltas(handle, {})
        return self.chat_result(handle)

    def chat_result(self, handle) -> ChatResult:
        """The whole reply of a submitted chat (``submit(chat_inputs(...))``)."""
        final: dict[str, Any] = {}
        deltas = list(self._chat_deltas(handle, final))
        audio_parts = [d.audio for d in deltas if d.audio is not None]
        audio = np.concatenate(audio_parts) if audio_parts else None
        text = final.get("text") or "".join(d.text for d in deltas)
        return ChatResult(
            text, audio, self.sample_rate if audio is not None else None, dict(final.get("usage") or {})
        )

    def _chat_deltas(self, handle, final: dict) -> Iterator[ChatDelta]:
        try:
            for event in handle:
                payload = event.payload
                if event.name == "text":
                    if event.end:
                        final.update(payload)
                    elif payload.get("text"):
                        yield ChatDelta(text=payload["text"])
                elif event.name == "audio" and "audio" in payload:
                    yield ChatDelta(audio=to_numpy(payload["audio"]))
        finally:
            if not handle.done:
                handle.abort()
