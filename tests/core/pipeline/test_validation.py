"""Build-time validation: each broken topology is a TopologyError that says what and where."""

from __future__ import annotations

import pytest
from omni_core.pipeline import Edge, Pipeline, StageSpec, Topology, TopologyError, validate_topology

from tests.core.pipeline import toy_topologies as toy


def chain(edges, outputs=None, entry="a.in", extra=()):
    stages = [StageSpec(n, "fn", toy.cv_frontend) for n in ("a", "b", "c", *extra)]
    return Topology(
        stages=stages, edges=edges, entry=entry, outputs={"out": "c.out"} if outputs is None else outputs
    )


@pytest.mark.parametrize(
    "topology, message",
    [
        (chain([Edge("a.out", "b.in"), Edge("b.out", "zz.in")]), "unknown stage 'zz'"),
        (
            chain([Edge("a.out", "b.in"), Edge("b.out", "c.in")], entry="nope.in"),
            "entry: unknown stage 'nope'",
        ),
        (chain([Edge("a.out", "b.nope"), Edge("b.out", "c.in")]), "stage 'b' has no input 'nope'"),
        (chain([Edge("a.out", "b.in", kind="broadcast"), Edge("b.out", "c.in")]), "unknown kind 'broadcast'"),
        (
            chain([Edge("a.out", "b.in"), Edge("b.out", "c.in"), Edge("c.out", "b.in", "stream")]),
            "cycle without a feedback edge: b -> c -> b",
        ),
        (chain([Edge("a.out", "c.in"), Edge("b.out", "c.in", "stream")]), "unreachable stage(s) ['b']"),
        (chain([Edge("a.out", "b.in"), Edge("b.out", "c.in")], outputs={}), "no terminal outputs"),
        (
            chain([Edge("a.out", "b.in"), Edge("b.out", "c.in")], outputs={"x": "c.wav"}),
            "terminal output 'x'",
        ),
        (
            chain([Edge("a.out", "b.in"), Edge("a.out", "c.in")], outputs={"x": "c.out"}),
            "stage 'b' has no outgoing edge and no terminal output",
        ),
        (
            chain([Edge("a.out", "b.in"), Edge("b.out", "c.in"), Edge("a.out", "c.in")]),
            "input 'c.in' already has a message edge",
        ),
        (chain([Edge("a.out", "b.in"), Edge("b.out", "c.in")], extra=("c",)), "duplicate stage name"),
        (chain([Edge("a.out", "b.in"), Edge("bout", "c.in")]), "must be written 'stage.port'"),
    ],
)
def test_broken_topologies_are_rejected_with_a_clear_error(topology, message):
    with pytest.raises(TopologyError) as error:
        Pipeline(topology)
    assert message in str(error.value)


def test_the_four_shapes_validate_and_feedback_edges_may_close_a_cycle():
    for builder in toy.BUILDERS.values():
        assert validate_topology(builder()) is not None
    loop = chain([Edge("a.out", "b.in"), Edge("b.out", "c.in"), Edge("c.out", "b.in", "feedback")])
    assert validate_topology(loop) is loop


def test_placement_errors_are_clear():
    with pytest.raises(TopologyError, match="placement names unknown stage 'vocoder'"):
        Pipeline(
            toy.cosyvoice_like(),
            placement={"vocoder": "process"},
            rebuild=toy.cosyvoice_like,
            plugin_manager=toy.core_plugins(),
        )
    with pytest.raises(ValueError, match="need rebuild="):
        Pipeline(toy.cosyvoice_like(), stage_mode="process", plugin_manager=toy.core_plugins())
    with pytest.raises(ValueError, match="'inproc' cannot cross processes"):
        Pipeline(
            toy.cosyvoice_like(),
            placement={"flow": "process"},
            transport="inproc",
            plugin_manager=toy.core_plugins(),
            rebuild=toy.cosyvoice_like,
        )
    with pytest.raises(ValueError, match="stage_mode must be one of"):
        Pipeline(toy.cosyvoice_like(), stage_mode="threads")
