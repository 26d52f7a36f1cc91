"""`omni serve` with stages on Ray actors, when the cluster's head node (its GCS) is killed: a real
local two-node cluster on 127.0.0.1, a real server and client. While the GCS does not answer,
/health and new requests get 503 naming the cluster; once it counts as lost, the requests in
flight get 503 ``cluster_lost`` and the server exits with one line and code 1, before Ray would
end it, also while it is restarting a stage that died with the head. Skipped where Ray is not
installed."""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import time

import httpx
import pytest

from tests.core.serve.server import ServerProcess, metric
from tests.helpers.ray_cluster import RAY_ENV, import_ray, two_node_cluster

import_ray()
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

# Ray ends a driver whose GCS stays away this long (60 s by default); the server gives up 5 s before
RAY_RECONNECT_S = 8


@contextlib.contextmanager
def served_on_a_cluster(site, workdir, *placement: str):
    """A fresh cluster (its head is killed) and the test family served with ``placement``."""
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # this process stays out of the cluster: Ray would end it too once the GCS is gone
    with two_node_cluster({"PYTHONPATH": path, "OMNI_TESTFAMILY_STEP_MS": "20"}, connect=False) as cluster:
        server = ServerProcess(
            site,
            workdir,
            *placement,
            step_ms=20,
            RAY_ADDRESS=cluster.address,
            RAY_gcs_rpc_server_reconnect_timeout_s=str(RAY_RECONNECT_S),
            **RAY_ENV,
        )
        try:
            yield cluster, server.wait_ready()
        finally:
            server.kill()


def speak(server, text: str) -> httpx.Response:
    body = {"model": "testfamily", "input": text, "voice": "alloy", "response_format": "pcm"}
    return httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=60)


def kill_the_head_under_a_request(cluster, server, pool) -> tuple[float, concurrent.futures.Future]:
    in_flight = pool.submit(speak, server, "Long enough to outlast the cluster. " * 100)
    deadline = time.monotonic() + 20
    while metric(server.url, "omni_stage_requests", stage="tts") < 1:
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.02)
    killed = time.monotonic()
    cluster.head_node.kill_all_processes(check_alive=False, allow_graceful=False)
    return killed, in_flight


def assert_it_ended_in_one_line(server, cluster, killed: float) -> None:
    assert server.process.wait(timeout=30) == 1
    assert time.monotonic() - killed < RAY_RECONNECT_S  # its own exit, not Ray's
    log = server.log_path.read_text()
    said = [line for line in log.splitlines() if line.startswith("omni serve: the Ray cluster")]
    assert said == [
        f"omni serve: the Ray cluster at {cluster.address} is lost: its GCS (the head node) has not "
        f"answered for {RAY_RECONNECT_S - 5} s; exiting"
    ], log
    assert "Traceback" not in log and "Failed to connect to GCS" not in log, log


def test_a_lost_head_node_answers_503_and_ends_the_server_in_one_line(testfamily_site, tmp_path):
    # the stage's actor is on the far node: it outlives the head, and its request goes on
    far = ("--placement", "tts=ray", "--stage-resources", 'tts={"CPU": 0.5, "far_node": 1}')
    with (
        served_on_a_cluster(testfamily_site, tmp_path, *far) as (cluster, server),
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        killed, in_flight = kill_the_head_under_a_request(cluster, server, pool)
        health = httpx.get(f"{server.url}/health", timeout=5)
        while health.status_code == 200 and time.monotonic() < killed + 5:
            time.sleep(0.1)
            health = httpx.get(f"{server.url}/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "unavailable", health.text
        assert f"the Ray cluster at {cluster.address} does not answer" in health.json()["error"]
        refused = speak(server, "Hello.")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "cluster_unreachable", refused.text
        assert "Retry-After" in refused.headers

        failed = in_flight.result(timeout=30)
        error = failed.json()["error"]
        assert failed.status_code == 503 and error["code"] == "cluster_lost", failed.text
        assert error["message"].startswith(f"the Ray cluster at {cluster.address} is lost")
        assert_it_ended_in_one_line(server, cluster, killed)


def test_a_stage_lost_with_the_head_does_not_hold_the_exit(testfamily_site, tmp_path):
    """The stage's actor dies with the head: its request fails as a dead actor's does, and the
    restart that can never come (no GCS to place it) does not keep the server from ending."""
    head = ("--placement", "tts=ray", "--stage-resources", 'tts={"CPU": 0.5, "head_node": 1}')
    with (
        served_on_a_cluster(testfamily_site, tmp_path, *head) as (cluster, server),
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        killed, in_flight = kill_the_head_under_a_request(cluster, server, pool)
        failed = in_flight.result(timeout=30)
        assert failed.status_code == 503 and failed.json()["error"]["code"] == "stage_restarting", failed.text
        assert_it_ended_in_one_line(server, cluster, killed)
