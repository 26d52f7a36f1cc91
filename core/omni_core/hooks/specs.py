"""Plain data the plugin contract exchanges.

Every hook returns one of these records. They hold names, callables and metadata only, so this
module imports nothing from the layers above it (pipeline, scheduler, serve): a family's
builder returns a ``omni_core.pipeline.Topology`` but the contract never imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

TASKS = ("speech", "transcription", "translation", "chat")  # translation: speech in, English text out


@dataclass(frozen=True)
class Voice:
    """A built-in voice a family offers without any reference audio."""

    id: str
    name: str
    description: str = ""


@dataclass(frozen=True)
class ReferenceLimits:
    """The reference audio (a clip to clone a voice from) a family can use: how long it lasts
    and its sample rate, bounds included. A voice saved outside them could never be used, so
    saving one is refused; the family's stage refuses a request's reference with ``problem``."""

    min_seconds: float = 0.0
    max_seconds: float = float("inf")
    min_sample_rate: int = 1
    max_sample_rate: int = 1_000_000

    def __str__(self) -> str:
        return f"{self.min_seconds:g}-{self.max_seconds:g} s at {self.min_sample_rate}-{self.max_sample_rate} Hz"

    def problem(self, seconds: float, sample_rate: int) -> str | None:
        """Why a clip of ``seconds`` at ``sample_rate`` is out of bounds, naming them (None: it fits)."""
        if not self.min_sample_rate <= sample_rate <= self.max_sample_rate:
            return f"reference audio must last {self}; this one is sampled at {sample_rate} Hz"
        if not self.min_seconds <= seconds <= self.max_seconds:
            return f"reference audio must last {self}; this one lasts {seconds:.2f} s"
        return None


@dataclass(frozen=True)
class FamilySpec:
    """A model family: what it can do and how a checkpoint becomes a stage topology.

    ``build(checkpoint_dir, options)`` runs wherever the topology is needed (the server process,
    and again inside every spawned stage process, so it must be cheap: load weights inside the
    stage factories, not here) and returns an ``omni_core.pipeline.Topology``.
    ``presets`` maps a preset name (``"tiny"`` at least) to a callable that materialises that
    preset into a directory in the family's official checkpoint layout and returns the path.
    ``voices(checkpoint_dir)`` lists built-in voices of a checkpoint.
    ``checkpoint_tasks(checkpoint_dir)`` gives the tasks of ``tasks`` a checkpoint does, where not
    all of them (an English-only Whisper checkpoint does not translate); the server lists and
    accepts those only.
    ``split_speech(checkpoint_dir, payload)`` may cut a speech request's entry payload into the
    payloads of its segments (a long text, sentence by sentence): they run as requests one after
    another and their audio is joined in order (``omni_core.pipeline.SegmentedHandle``); a list
    of one payload leaves the request whole. It runs on the server's event loop (keep it cheap)
    and once with a short text at start-up, to load what it needs then. Each segment starts while
    the one before is still read, unless ``segments_in_turn``: then it starts once the one before
    has ended, for a family whose segment prompts carry what the segments before generated.
    ``options`` names the build options the family reads (``--option KEY=VALUE``), each with one
    line saying its default and what it does; where given, keys it does not name are refused
    (``check_option_names``) and ``omni families NAME`` lists them. None: undeclared, unchecked.
    ``reference_limits`` bounds the reference audio a family clones from (``ReferenceLimits``);
    None: any.
    """

    name: str
    tasks: tuple[str, ...]
    build: Callable[[str, dict[str, Any]], Any]
    default_checkpoint: str | None = None
    presets: dict[str, Callable[[str], str]] = field(default_factory=dict)
    sample_rate: int | None = None  # of audio the family produces (speech, chat audio)
    input_sample_rate: int | None = None  # of audio the family consumes (transcription, chat)
    voices: Callable[[str], list[Voice]] | None = None
    split_speech: Callable[[str, dict[str, Any]], list[dict[str, Any]]] | None = None
    segments_in_turn: bool = False
    checkpoint_tasks: Callable[[str], tuple[str, ...]] | None = None
    description: str = ""
    options: dict[str, str] | None = None
    reference_limits: ReferenceLimits | None = None

    def __post_init__(self) -> None:
        unknown = [t for t in self.tasks if t not in TASKS]
        if unknown:
            raise ValueError(f"family {self.name!r}: unknown tasks {unknown}; known: {list(TASKS)}")


@dataclass(frozen=True)
class EngineSpec:
    """How a stage's executor is made. A stage names the engine it needs (``"ar"``, ``"batch"``...).

    ``build(stage, context)`` receives the ``omni_core.pipeline.StageSpec`` and a
    ``omni_core.pipeline.StageContext`` (device, platform, request emit callback, options) and
    returns an object implementing ``omni_core.pipeline.Executor``.
    """

    name: str
    build: Callable[[Any, Any], Any]
    description: str = ""


@dataclass(frozen=True)
class TransportSpec:
    """A way to move tensors between stages: ``factory(options)`` returns a ``omni_core.comm.Transport``."""

    name: str
    factory: Callable[[dict[str, Any]], Any]
    description: str = ""
    cross_process: bool = True
    cross_host: bool = False
