"""Build-time checks of a ``Topology``: each problem is a ``TopologyError`` that names the stage or edge."""

from __future__ import annotations

from collections import defaultdict

from omni_core.pipeline.topology import EDGE_KINDS, Topology, TopologyError, split_port

# A stage fed by several message edges is a fan-in: it receives one message on this port whose
# payload maps each of its input ports to what arrived there.
JOINED_PORT = "*"


def _port(topology: Topology, port: str, side: str, where: str) -> tuple[str, str]:
    stage_name, port_name = split_port(port)
    names = [s.name for s in topology.stages]
    if stage_name not in names:
        raise TopologyError(f"{where}: unknown stage {stage_name!r} in {port!r}; stages: {names}")
    stage = topology.stage(stage_name)
    ports = stage.outputs if side == "output" else stage.inputs
    if port_name not in ports:
        raise TopologyError(
            f"{where}: stage {stage_name!r} has no {side} {port_name!r}; its {side}s: {list(ports)}"
        )
    return stage_name, port_name


def _find_cycle(stages: list[str], edges: list[tuple[str, str]]) -> list[str] | None:
    graph: dict[str, list[str]] = defaultdict(list)
    for src, dst in edges:
        graph[src].append(dst)
    state: dict[str, int] = {}  # 1 = on the current path, 2 = finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for stage in stages:
        if stage not in state:
            found = visit(stage)
            if found:
                return found
    return None


def validate_topology(topology: Topology) -> Topology:
    """Raise ``TopologyError`` naming the first problem; return the topology when it can run."""
    names = [s.name for s in topology.stages]
    if not names:
        raise TopologyError("topology has no stages")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TopologyError(f"duplicate stage name(s): {duplicates}")
    for stage in topology.stages:
        if "." in stage.name or not stage.name:
            raise TopologyError(f"stage name {stage.name!r} must be non-empty and contain no '.'")
        if JOINED_PORT in stage.inputs:
            raise TopologyError(f"stage {stage.name!r}: input name {JOINED_PORT!r} is reserved")

    entry_stage, _ = _port(topology, topology.entry, "input", "entry")

    if not topology.outputs:
        raise TopologyError("topology has no terminal outputs: name at least one in Topology.outputs")
    for out_name, port in topology.outputs.items():
        _port(topology, port, "output", f"terminal output {out_name!r}")

    message_inputs: dict[str, list[str]] = defaultdict(list)  # stage -> input ports fed by message edges
    flow: list[tuple[str, str]] = []
    adjacency: dict[str, set[str]] = defaultdict(set)
    for edge in topology.edges:
        where = f"edge {edge.src!r} -> {edge.dst!r}"
        if edge.kind not in EDGE_KINDS:
            raise TopologyError(f"{where}: unknown kind {edge.kind!r}; kinds: {list(EDGE_KINDS)}")
        src, _ = _port(topology, edge.src, "output", where)
        dst, dst_port = _port(topology, edge.dst, "input", where)
        if edge.when is not None and not callable(edge.when):
            raise TopologyError(f"{where}: 'when' must be callable(request_inputs) -> bool")
        if edge.kind == "message":
            if dst_port in message_inputs[dst]:
                raise TopologyError(
                    f"{where}: input {edge.dst!r} already has a message edge; a fan-in needs one input per edge"
                )
            message_inputs[dst].append(dst_port)
        if edge.kind != "feedback":
            flow.append((src, dst))
        adjacency[src].add(dst)

    cycle = _find_cycle(names, flow)
    if cycle:
        raise TopologyError(
            f"cycle without a feedback edge: {' -> '.join(cycle)}; mark the edge that closes a "
            "per-step loop kind='feedback'"
        )

    reached = {entry_stage}
    frontier = [entry_stage]
    while frontier:
        for nxt in adjacency[frontier.pop()]:
            if nxt not in reached:
                reached.add(nxt)
                frontier.append(nxt)
    unreachable = [n for n in names if n not in reached]
    if unreachable:
        raise TopologyError(f"unreachable stage(s) {unreachable}: no edge path from entry {topology.entry!r}")

    terminal_stages = {split_port(port)[0] for port in topology.outputs.values()}
    for name in names:
        if not adjacency[name] and name not in terminal_stages:
            raise TopologyError(
                f"stage {name!r} has no outgoing edge and no terminal output: its results would be lost"
            )
    return topology
