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
    terminal output name (``"text"``, ``"audio"``) to the stage output port that produces it."""

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
