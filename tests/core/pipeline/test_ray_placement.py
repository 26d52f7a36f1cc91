"""Stages placed on Ray actors of a real local two-node cluster (both nodes on 127.0.0.1): the
results of in-process placement, shared memory to the runtime's node and zmq to the other, a
killed actor restarted, start-up failures that name what cannot be placed, and nothing left
behind (actors, placement groups, shared memory). Skipped where Ray is not installed."""

from __future__ import annotations

import functools
import glob
import os
import signal

import pytest
import torch
from omni_core.pipeline import Pipeline, RequestFailed

from tests.core.pipeline import toy_topologies as toy
from tests.helpers.ray_cluster import (
    NODE,
    descendants,
    import_ray,
    listening_addresses,
    live_actors,
    live_placement_groups,
    node_names,
    settled,
    two_node_cluster,
)

import_ray()
from omni_core.pipeline.ray_placement import RayOptions, RayPlacementError  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def cluster():
    with two_node_cluster() as started:
        yield started


def on(node: str) -> dict[str, float]:
    """A stage's bundle that lands it on ``node`` (``head_node`` or ``far_node``)."""
    return {"CPU": 0.5, node: 1}


def audio_of(events) -> torch.Tensor:
    return torch.cat([e.payload["audio"] for e in events if "audio" in e.payload])


def left_behind(pipeline) -> dict[str, list]:
    return {
        "actors": settled(live_actors),
        "placement groups": settled(live_placement_groups),
        "shared memory": glob.glob(f"/dev/shm/{pipeline.prefix}*"),
    }


NOTHING = {"actors": [], "placement groups": [], "shared memory": []}


def runtime_node() -> str:
    import ray

    return node_names()[ray.get_runtime_context().get_node_id()]


def other_node() -> str:
    return "far_node" if runtime_node() == "head_node" else "head_node"


def test_stages_on_two_nodes_give_the_in_process_results(cluster):
    audio, image = torch.randn(96_000), torch.randn(8, 8)  # 384 KB: a shared-memory segment on one node
    pipeline = Pipeline(
        toy.omni_like(),
        plugin_manager=toy.core_plugins(),
        placement={"audio_encoder": "ray", "talker": "ray"},  # talker <-> code_predictor crosses
        rebuild=functools.partial(toy.build, "omni"),
        ray=RayOptions(resources={"audio_encoder": on("far_node"), "talker": on("head_node")}),
    )
    with pipeline:
        stats = pipeline.stats()["stages"]
        names = node_names()
        assert names[stats["audio_encoder"]["node"]] == "far_node"
        assert names[stats["talker"]["node"]] == "head_node"
        for stage in ("audio_encoder", "talker"):
            assert stats[stage]["placement"] == "ray" and stats[stage]["pid"] != os.getpid()
            # shared memory only to the runtime's own node, tcp to the other
            expected = "shm" if names[stats[stage]["node"]] == runtime_node() else "zmq"
            assert stats[stage]["transport"] == expected, (stage, stats[stage])
        handles = [
            pipeline.submit({"text": "hi", "audio": audio, "image": image, "modalities": ["text", "audio"]}),
            pipeline.submit({"text": "yo", "audio": audio, "modalities": ["text", "audio"]}),
        ]
        results = [h.collect(timeout=30) for h in handles]
        ref_text, ref_audio = toy.reference_omni("hi", audio, image)
        assert results[0]["text"][-1].payload["text"] == ref_text
        assert torch.allclose(audio_of(results[0]["audio"]), ref_audio)
        assert torch.allclose(audio_of(results[1]["audio"]), toy.reference_omni("yo", audio)[1])
        assert len(live_actors()) == 2 and len(live_placement_groups()) == 1
        # nothing of the cluster, its actors or the runtime listens beyond loopback
        ours = descendants(os.getpid())
        assert set(pipeline.stage_pids().values()) <= ours  # the actors are among the processes checked
        listening = listening_addresses(ours)
        loopback = ("127.0.0.1", "0" * 31 + "1", "0" * 20 + "ffff" + "7f000001")  # v4, ::1, v4-mapped
        assert listening and all(address in loopback for _, address in listening), listening
    assert left_behind(pipeline) == NOTHING


def test_spread_lays_the_stages_over_both_nodes(cluster):
    audio = torch.randn(4000)
    pipeline = Pipeline(
        toy.asr_like(),
        plugin_manager=toy.core_plugins(),
        placement={"encoder": "ray", "decoder": "ray"},
        rebuild=functools.partial(toy.build, "asr"),
        ray=RayOptions(strategy="SPREAD"),  # 1 CPU each: PACK could have put both on one node
    )
    with pipeline:
        nodes = {s["node"] for s in pipeline.stats()["stages"].values() if s["placement"] == "ray"}
        assert set(node_names()[n] for n in nodes) == {"head_node", "far_node"}
        text = pipeline.submit({"audio": audio}).collect(timeout=30)["text"][-1].payload["text"]
        assert text == toy.reference_asr(audio)
    assert left_behind(pipeline) == NOTHING


def test_a_killed_actor_fails_its_requests_and_is_restarted(cluster):
    pipeline = Pipeline(
        toy.fish_like(),
        plugin_manager=toy.core_plugins(),
        placement={"dual_ar": "ray"},
        rebuild=functools.partial(toy.build, "fish"),
        ray=RayOptions(resources={"dual_ar": on("far_node")}),
    )
    with pipeline:
        first_pid = pipeline.stage_pids()["dual_ar"]
        handle = pipeline.submit({"text": "in flight", "frames": 400, "delay_s": 0.02})
        assert handle.get(timeout=20).name == "audio"  # the actor is mid-stream
        os.kill(first_pid, signal.SIGKILL)  # the far node is a process of this machine too
        with pytest.raises(
            RequestFailed, match=r"stage 'dual_ar' failed: stage process died .*being restarted"
        ):
            handle.get(timeout=5.0)

        after = pipeline.submit({"text": "after restart"}).collect(timeout=60)  # waits for the new actor
        assert torch.allclose(audio_of(after["audio"]), toy.reference_fish("after restart"))
        stats = pipeline.stats()["stages"]["dual_ar"]
        assert stats["restarts"] == 1 and stats["pid"] != first_pid and stats["state"] == "running"
        assert node_names()[stats["node"]] == "far_node"  # back in its bundle
        assert len(live_actors()) == 1
    assert left_behind(pipeline) == NOTHING


def test_a_stage_no_node_can_hold_fails_at_start_naming_it(cluster):
    pipeline = Pipeline(
        toy.asr_like(),
        plugin_manager=toy.core_plugins(),
        placement={"encoder": "ray", "decoder": "ray"},
        rebuild=functools.partial(toy.build, "asr"),
        ray=RayOptions(resources={"decoder": {"CPU": 1, "GPU": 1}}),
    )
    with pytest.raises(
        RayPlacementError, match=r"^stage 'decoder' needs \{\"CPU\": 1, \"GPU\": 1\} on one node, and no node"
    ):
        pipeline.start()
    assert left_behind(pipeline) == NOTHING


def test_stages_that_do_not_fit_together_fail_after_the_placement_timeout(cluster):
    pipeline = Pipeline(
        toy.asr_like(),
        plugin_manager=toy.core_plugins(),
        placement={"encoder": "ray", "decoder": "ray"},
        rebuild=functools.partial(toy.build, "asr"),
        # each fits the far node (8 far_node), both do not
        ray=RayOptions(resources={"encoder": {"far_node": 5}, "decoder": {"far_node": 5}}, place_timeout_s=2),
    )
    with pytest.raises(
        RayPlacementError,
        match=r"could not place the stages \(PACK: encoder \{\"far_node\": 5\}, decoder \{\"far_node\": 5\}\) within 2 s",
    ):
        pipeline.start()
    assert left_behind(pipeline) == NOTHING


def test_a_transport_that_cannot_cross_hosts_fails_at_start(cluster):
    far = other_node()
    pipeline = Pipeline(
        toy.fish_like(),
        plugin_manager=toy.core_plugins(),
        placement={"dual_ar": "ray"},
        rebuild=functools.partial(toy.build, "fish"),
        ray=RayOptions(resources={"dual_ar": on(far)}, remote_transport="shm"),
    )
    with pytest.raises(
        RayPlacementError,
        match=r"stage 'dual_ar' was placed on node \w+, not the runtime's \(\w+\), and transport 'shm' cannot "
        r"cross hosts; use one of \['nccl', 'zmq'\]",
    ):
        pipeline.start()
    assert left_behind(pipeline) == NOTHING


def test_a_lost_node_ends_its_stage_process_and_the_stage_comes_back_on_a_new_one(cluster):
    """Nothing ends an actor whose raylet died (its node lost): the stage watches the raylet and
    its process ends with it; the runtime fails the requests it held and restarts the stage, which
    starts once a node can hold its bundle again (Ray places the group's lost bundle anew)."""
    lost = other_node()
    pipeline = Pipeline(
        toy.fish_like(),
        plugin_manager=toy.core_plugins(),
        placement={"dual_ar": "ray"},
        rebuild=functools.partial(toy.build, "fish", start_timeout_s=60),  # a restart waits for the node
        ray=RayOptions(resources={"dual_ar": on(lost)}),
    )
    with pipeline:
        victim = pipeline.stage_pids()["dual_ar"]
        handle = pipeline.submit({"text": "in flight", "frames": 400, "delay_s": 0.02})
        assert handle.get(timeout=20).name == "audio"
        where = pipeline.stats()["stages"]["dual_ar"]["node"]
        [node] = [n for n in cluster.list_all_nodes() if n.node_id == where]
        cluster.remove_node(node, allow_graceful=False)  # its raylet is killed, its workers are not
        with pytest.raises(RequestFailed, match=r"stage 'dual_ar' failed: stage process died"):
            while handle.get(timeout=10.0) is not None:  # what was sent before; then the failure
                pass
        assert settled(lambda: _alive(victim), timeout_s=10) is False

        cluster.add_node(**NODE, resources={lost: 8})
        after = pipeline.submit({"text": "on the new node"}).collect(timeout=90)
        assert torch.allclose(audio_of(after["audio"]), toy.reference_fish("on the new node"))
        stats = pipeline.stats()["stages"]["dual_ar"]
        assert stats["restarts"] == 1 and stats["node"] != where and node_names()[stats["node"]] == lost
    assert left_behind(pipeline) == NOTHING


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False
