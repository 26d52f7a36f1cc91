"""`omni serve --placement ray` on a real local two-node Ray cluster (both nodes on 127.0.0.1):
the cosyvoice3 and whisper tiny presets with their stages spread over both nodes answer what the
same server answers with every stage in process, for the same seed; after SIGTERM no actor,
placement group or shared memory of the server is left, and its output holds no traceback or stack
dump. Skipped where Ray is not installed."""

from __future__ import annotations

import concurrent.futures
import glob
import io
import json
import os
import signal
import time

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.core.serve.server import API_KEY, ServerProcess, metric
from tests.helpers.packaging import env_with_path, run_omni
from tests.helpers.ray_cluster import (
    RAY_ENV,
    death_causes,
    import_ray,
    live_actors,
    live_placement_groups,
    node_names,
    settled,
)
from tests.helpers.server import OmniServer, free_port

import_ray()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

# stage -> the node its bundle asks for; the other stages stay in the server's process (each
# actor pays a Python start and the imports of its stage: two keep the test short)
SPREAD = {
    "cosyvoice3": {"llm": "far_node", "flow": "head_node"},
    "whisper": {"encoder": "far_node", "decoder": "head_node"},
}


# every process on torch's linear, not a host kernel chosen by timing it at start (a choice that
# timing could make differently in two processes, and that costs seconds of each start)
SAME_KERNELS = {"OMNI_HOST_LINEAR": "0"}


@pytest.fixture(scope="module")
def cluster(testfamily_site):
    from tests.helpers.ray_cluster import two_node_cluster

    # the test family's actors import it from its --target folder; its tts steps take 20 ms
    path = os.pathsep.join([str(testfamily_site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    with two_node_cluster({"PYTHONPATH": path, "OMNI_TESTFAMILY_STEP_MS": "20", **SAME_KERNELS}) as started:
        yield started


@pytest.fixture(scope="module")
def omni_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("ray-serve-cache")


def write_preset(family: str, cache) -> None:
    """Written once here: the two servers then find it under OMNI_CACHE instead of both writing it."""
    from omni_core.hooks import get_plugin_manager
    from omni_core.surface.checkpoints import resolve_checkpoint

    resolve_checkpoint(get_plugin_manager().family(family), None, "tiny", str(cache))


def serve_both(family: str, cluster, cache, workdir) -> tuple[OmniServer, OmniServer]:
    """The family's tiny preset served twice: every stage in process, and with two stages on Ray
    actors, one on each node."""
    pytest.importorskip(f"omni_{family}", reason=f"the {family} plugin is not installed")
    write_preset(family, cache)
    env = {"OMNI_PLUGINS": family, "OMNI_CACHE": str(cache), "OMP_NUM_THREADS": "1", **SAME_KERNELS}
    ray_args = [
        arg
        for stage, node in SPREAD[family].items()
        for arg in (
            "--placement",
            f"{stage}=ray",
            "--stage-resources",
            f"{stage}={json.dumps({'CPU': 0.5, node: 1})}",
        )
    ]
    inproc = OmniServer(family, workdir, "--preset", "tiny", **env)
    on_ray = OmniServer(
        family,
        workdir,
        "--preset",
        "tiny",
        *ray_args,
        RAY_ADDRESS=cluster.address,
        **RAY_ENV,
        **env,
    )
    return inproc.wait_ready(), on_ray.wait_ready()


def actors_on_nodes() -> dict[int, str]:
    """pid -> node name of every live actor."""
    import ray._private.state

    names = node_names()
    return {
        a["Pid"]: names[a["Address"]["NodeID"]]
        for a in ray._private.state.actors().values()
        if a["State"] != "DEAD"
    }


def stop_and_check_nothing_left(server: OmniServer, actor_pids: list[int]) -> None:
    assert server.stop() == 0, server.log()  # SIGTERM
    # an orderly shutdown: no Python traceback, no native stack dump (Ray's crash handler's)
    log = server.log_path.read_text()
    assert "Traceback" not in log and "SIGTERM received" not in log, log
    owners = [server.process.pid, *actor_pids]
    segments = [p for pid in owners for p in glob.glob(f"/dev/shm/omni-*-{pid}-*")]
    assert settled(lambda: live_actors() + live_placement_groups()) == [] and segments == []
    # removed by the server's shutdown (killed, or its last handle dropped), not by Ray after the
    # server was gone (OWNER_DIED)
    assert set(death_causes(actor_pids).values()) <= {"RAY_KILL", "REF_DELETED"}, death_causes(actor_pids)


def test_cosyvoice3_on_two_nodes_speaks_as_in_process(cluster, omni_cache, tmp_path):
    inproc, on_ray = serve_both("cosyvoice3", cluster, omni_cache, tmp_path)
    try:
        actors = actors_on_nodes()
        assert sorted(actors.values()) == ["far_node", "head_node"]
        body = {
            "model": "cosyvoice3",
            "input": "Stages on two nodes.",
            "voice": "default",
            "response_format": "pcm",
        }
        audio = []
        for server in (inproc, on_ray):
            replies = [
                httpx.post(f"{server.url}/v1/audio/speech", json={**body, "seed": seed}, timeout=120)
                for seed in (3, 4)
            ]
            assert all(r.status_code == 200 for r in replies), [r.text for r in replies]
            audio.append([np.frombuffer(r.content, dtype="<i2").astype(np.int32) for r in replies])
        for expected, got in zip(audio[0], audio[1], strict=True):
            assert len(got) == len(expected) > 0
            assert np.abs(got - expected).max() <= 1  # float noise may move a sample by one step
        assert not np.array_equal(
            audio[0][0][: len(audio[0][1])], audio[0][1][: len(audio[0][0])]
        )  # seeds matter
        stop_and_check_nothing_left(on_ray, list(actors))
    finally:
        inproc.stop()
        on_ray.kill()


def test_whisper_on_two_nodes_transcribes_as_in_process(cluster, omni_cache, tmp_path):
    inproc, on_ray = serve_both("whisper", cluster, omni_cache, tmp_path)
    try:
        actors = actors_on_nodes()
        assert sorted(actors.values()) == ["far_node", "head_node"]
        rng = np.random.default_rng(0)
        texts = []
        for server in (inproc, on_ray):
            replies = []
            for seconds in (1.0, 2.5):
                wav = io.BytesIO()
                sf.write(
                    wav,
                    (0.1 * rng.standard_normal(int(16000 * seconds))).astype(np.float32),
                    16000,
                    format="WAV",
                )
                files = {"file": ("noise.wav", wav.getvalue(), "audio/wav")}
                reply = httpx.post(
                    f"{server.url}/v1/audio/transcriptions",
                    data={"model": "whisper"},
                    files=files,
                    timeout=120,
                )
                assert reply.status_code == 200, reply.text
                replies.append(reply.json()["text"])
            texts.append(replies)
            rng = np.random.default_rng(0)  # the same audio for the second server
        assert texts[0] == texts[1] and any(texts[0]), texts
        stop_and_check_nothing_left(on_ray, list(actors))
    finally:
        inproc.stop()
        on_ray.kill()


def test_placement_and_stage_resources_parse_or_say_what_is_wrong():
    from omni_core.serve.command import _placement_map, _ray_options

    assert _placement_map(("ray",)) == ("ray", {})
    assert _placement_map(("ray", "flow=inproc")) == ("ray", {"flow": "inproc"})
    assert _placement_map(("flow=ray",)) == (None, {"flow": "ray"})
    with pytest.raises(ValueError, match="--placement takes STAGE=VALUE, got 'tts'"):
        _placement_map(("tts",))
    options = _ray_options(None, "spread", {"llm": '{"CPU": 2, "GPU": 1}'})
    assert (options.strategy, options.resources) == ("SPREAD", {"llm": {"CPU": 2, "GPU": 1}})
    with pytest.raises(ValueError, match="--stage-resources llm= takes a JSON object"):
        _ray_options(None, "PACK", {"llm": "2"})
    with pytest.raises(ValueError, match="resources of stage 'llm' must map resource names to amounts >= 0"):
        _ray_options(None, "PACK", {"llm": '{"GPU": -1}'})


def test_a_stage_the_cluster_cannot_hold_fails_the_start_in_one_line(cluster, omni_cache):
    pytest.importorskip("omni_whisper", reason="the whisper plugin is not installed")
    write_preset("whisper", omni_cache)
    env = env_with_path(
        OMNI_PLUGINS="whisper", OMNI_CACHE=str(omni_cache), RAY_ADDRESS=cluster.address, **RAY_ENV
    )
    args = ["--placement", "encoder=ray", "--stage-resources", 'encoder={"CPU": 1, "GPU": 1}']
    result = run_omni(
        ["serve", "--family", "whisper", "--preset", "tiny", "--port", str(free_port()), *args], env
    )
    failure = [line for line in result.stderr.splitlines() if "loading failed" in line]
    assert result.returncode == 1 and len(failure) == 1, result.stderr
    assert (
        'stage \'encoder\' needs {"CPU": 1, "GPU": 1} on one node, and no node of the Ray cluster has it'
        in failure[0]
    )
    assert settled(lambda: live_actors() + live_placement_groups()) == []


def test_a_killed_actor_answers_503_and_serving_resumes(cluster, testfamily_site, tmp_path):
    """The process placement's fault semantics, reused: the in-flight request of a killed actor
    gets 503 with Retry-After, the actor comes back in its bundle and serves the next request."""
    server = ServerProcess(
        testfamily_site,
        tmp_path,
        "--api-key",
        API_KEY,
        "--placement",
        "tts=ray",
        "--stage-resources",
        'tts={"CPU": 0.5, "far_node": 1}',
        "--request-timeout",
        "60",
        step_ms=20,
        RAY_ADDRESS=cluster.address,
        **RAY_ENV,
    )
    try:
        server.wait_ready()
        [(victim, node)] = actors_on_nodes().items()
        assert node == "far_node"

        def speak(text: str) -> httpx.Response:
            body = {"model": "testfamily", "input": text, "voice": "alloy", "response_format": "pcm"}
            headers = {"Authorization": f"Bearer {API_KEY}"}
            return httpx.post(f"{server.url}/v1/audio/speech", json=body, headers=headers, timeout=60)

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            in_flight = pool.submit(speak, "Long enough to be in flight when its actor dies. " * 30)
            deadline = time.monotonic() + 20
            while metric(server.url, "omni_stage_requests", stage="tts") < 1 and time.monotonic() < deadline:
                time.sleep(0.02)
            os.kill(victim, signal.SIGKILL)  # the far node is a process of this machine too
            failed = in_flight.result(timeout=20)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "stage_restarting", failed.text
        assert "stage 'tts' failed: stage process died" in failed.json()["error"]["message"]
        assert int(failed.headers["Retry-After"]) >= 1

        after = speak("Back again.")
        assert after.status_code == 200 and len(after.content) > 0, after.text
        [(new_pid, node)] = actors_on_nodes().items()
        assert new_pid != victim and node == "far_node"
        stop_and_check_nothing_left(server, [new_pid])
    finally:
        server.kill()
