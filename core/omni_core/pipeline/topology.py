"""Stage topologies: stages with named ports, edges between them, and the request's outputs.

A family's ``build`` returns a ``Topology``; the runtime validates it (``validate``) and places
each stage in-process or in its own process. Ports are written ``"stage.port"``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

EdgeKind = Literal["message", "stream", "feedback"]
EDGE_KINDS = ("message", "stream", "feedback")


class TopologyError(ValueError):
    """A topology that cannot run: the message says which stage or edge and why."""


@dataclass
class StageSpec:
    """One stage.

    ``factory(context)`` builds the stage's worker in the process that hosts the stage (so
    weights load there); it must be picklable (a module-level function or a functools.partial
    of one) for process placement. What the worker must provide depends on ``engine``: see
    docs/architecture.md.
    """

    name: str
    engine: str
    factory: Callable[..., Any]
    inputs: tuple[str, ...] = ("in",)
    outputs: tuple[str, ...] = ("out",)
    device: str | None = None
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class Edge:
    """``src`` output port to ``dst`` input port.

    ``when(request_inputs) -> bool`` makes the edge conditional on the request's content (fan-out:
    only requests with images visit the image encoder); a stage whose every incoming edge is off
    for a request is skipped, and a fan-in waits only for the edges that are on.
    """

    src: str
    dst: str
    kind: EdgeKind = "message"
    when: Callable[[dict[str, Any]], bool] | None = None


@dataclass
class Topology:
    """``entry`` is the input port that receives the request's inputs; ``outputs`` maps each
    terminal output name (``"text"``, ``"audio"``) to the stage output port that produces it.

    What the server and ``Omni`` read from those ports (a stage emits more keys at will):

    - ``audio``: messages with ``{"audio": float32 mono samples [N]}`` at the family's
      ``sample_rate``, in order, the last one ``end=True`` (it may carry no samples).
    - ``text``: messages with ``{"text": delta}`` as the text grows; the last one (``end=True``)
      carries the whole ``text``, and for transcription and translation may add ``language``
      (a code; ``language_name`` where the family knows the name), ``duration`` (seconds of
      input audio), and ``segments``: ``[{"start": s, "end": s, "text": str, "words": [{"word":
      str, "start": s, "end": s}]}]``, words where the family aligns them.
    - ``usage`` on the last message of either: OpenAI's usage keys for the task, summed over
      segments of a split request: for speech ``{"input_tokens", "output_tokens"}`` (the server
      adds ``total_tokens``); for transcription ``{"type": "tokens", "input_tokens",
      "output_tokens", "total_tokens"}`` or ``{"type": "duration", "seconds"}``; for chat
      ``{"prompt_tokens", "completion_tokens", "total_tokens"}``.
    """

    stages: list[StageSpec]
    edges: list[Edge]
    entry: str
    outputs: dict[str, str]
    name: str = ""

    def stage(self, name: str) -> StageSpec:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise TopologyError(f"unknown stage {name!r}; stages: {[s.name for s in self.stages]}")


def split_port(port: str) -> tuple[str, str]:
    stage, sep, name = port.partition(".")
    if not sep or not stage or not name:
        raise TopologyError(f"port {port!r} must be written 'stage.port'")
    return stage, name
