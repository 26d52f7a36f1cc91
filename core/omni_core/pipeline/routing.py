"""Where each emitted message goes, and what each request is expected to bring.

``Routes`` is computed once per topology. ``RequestPlan`` is computed per request from its
inputs: the edges that carry for it (``Edge.when``), the stages it reaches, the terminal outputs
it must end, and for every fan-in stage the input ports it waits for.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from omni_core.pipeline.topology import Edge, Topology, TopologyError, split_port
from omni_core.pipeline.validation import JOINED_PORT
from omni_core.scheduler.executor import Message


class Routes:
    def __init__(self, topology: Topology):
        self.topology = topology
        self.entry_stage, self.entry_port = split_port(topology.entry)
        self.by_src: dict[str, list[tuple[int, Edge, str, str]]] = defaultdict(list)
        self.terminals: dict[str, list[str]] = defaultdict(list)  # "stage.port" -> output names
        self.outputs = {stage.name: tuple(stage.outputs) for stage in topology.stages}
        message_in: dict[str, int] = defaultdict(int)
        for index, edge in enumerate(topology.edges):
            dst_stage, dst_port = split_port(edge.dst)
            self.by_src[edge.src].append((index, edge, dst_stage, dst_port))
            if edge.kind == "message":
                message_in[dst_stage] += 1
        for name, port in topology.outputs.items():
            self.terminals[port].append(name)
        self.join_stages = {stage for stage, count in message_in.items() if count > 1}

    def plan(self, inputs: dict[str, Any]) -> RequestPlan:
        on: set[int] = set()
        for index, edge in enumerate(self.topology.edges):
            if edge.when is None:
                on.add(index)
                continue
            try:
                carries = bool(edge.when(inputs))
            except Exception as exc:
                raise TopologyError(f"edge {edge.src!r} -> {edge.dst!r}: its 'when' raised {exc!r}") from exc
            if carries:
                on.add(index)
        reached = {self.entry_stage}
        frontier = [self.entry_stage]
        while frontier:
            stage = frontier.pop()
            for port in self.topology.stage(stage).outputs:
                for index, _edge, dst, _ in self.by_src.get(f"{stage}.{port}", ()):
                    if index in on and dst not in reached:
                        reached.add(dst)
                        frontier.append(dst)
        expected = {
            name for port, names in self.terminals.items() for name in names if split_port(port)[0] in reached
        }
        joins: dict[str, set[str]] = {}
        for stage in self.join_stages & reached:
            joins[stage] = {
                split_port(edge.dst)[1]
                for index, edge in enumerate(self.topology.edges)
                if index in on
                and edge.kind == "message"
                and split_port(edge.dst)[0] == stage
                and split_port(edge.src)[0] in reached
            }
        return RequestPlan(on_edges=on, reached=reached, expected=expected, joins=joins)


@dataclass
class RequestPlan:
    on_edges: set[int]
    reached: set[str]
    expected: set[str]
    joins: dict[str, set[str]]
    ended: set[str] = field(default_factory=set)
    joined: dict[str, dict[str, Any]] = field(default_factory=dict)  # fan-in stage -> port -> payload

    @property
    def complete(self) -> bool:
        return self.expected <= self.ended

    def route(self, routes: Routes, stage: str, message: Message):
        """Terminal events and deliveries for one emitted message: (events, [(stage, Message)])."""
        src = f"{stage}.{message.port}"
        events = [(name, message) for name in routes.terminals.get(src, ())]
        for name, _ in events:
            if message.end:
                self.ended.add(name)
        deliveries: list[tuple[str, Message]] = []
        for index, edge, dst_stage, dst_port in routes.by_src.get(src, ()):
            if index not in self.on_edges:
                continue
            if edge.kind == "message" and dst_stage in self.joins:
                waiting = self.joined.setdefault(dst_stage, {})
                waiting[dst_port] = message.payload
                if set(waiting) >= self.joins[dst_stage]:
                    deliveries.append((dst_stage, Message(message.request_id, JOINED_PORT, dict(waiting))))
                    del self.joined[dst_stage]
                continue
            deliveries.append(
                (dst_stage, Message(message.request_id, dst_port, message.payload, message.end, message.seq))
            )
        return events, deliveries
