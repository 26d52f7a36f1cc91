"""A stage process SIGKILLed under a real `omni serve` (tts placed in its own process): its
in-flight requests get 503 with Retry-After (an error event in an SSE stream), a request sent
during the restart waits for it and succeeds, or gets 503 when its deadline passes first."""

from __future__ import annotations

import concurrent.futures
import glob
import json
import os
import signal
import time

import httpx
import openai
import pytest

from tests.core.serve.server import API_KEY, ServerProcess, metric

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
SPEECH = "/v1/audio/speech"
LONG = "Long enough to be in flight when its stage dies. " * 30  # ~125 tts steps of 20 ms


@pytest.fixture(scope="module")
def placed_server(testfamily_site, tmp_path_factory):
    server = ServerProcess(
        testfamily_site, tmp_path_factory.mktemp("restarts"), "--api-key", API_KEY,
        "--placement", "tts=process", "--request-timeout", "30", step_ms=20,
    )
    try:
        yield server.wait_ready()
    finally:
        assert server.stop() == 0, server.log()


def stage_pid(server) -> int:
    children = []
    for task in glob.glob(f"/proc/{server.process.pid}/task/*/children"):  # a restart spawns from a thread
        with open(task) as handle:
            children += [int(pid) for pid in handle.read().split()]
    stages = [pid for pid in children if "spawn_main" in open(f"/proc/{pid}/cmdline").read()]
    assert len(stages) == 1, stages
    return stages[0]


def speak(url: str, text: str, timeout_s: str | None = None):
    headers = {"X-Request-Timeout": timeout_s} if timeout_s else None
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0, default_headers=headers)
    return client.audio.speech.create(model="testfamily", voice="alloy", input=text, response_format="pcm")


def sse_events(url: str, text: str) -> list[dict]:
    body = {"model": "testfamily", "input": text, "voice": "alloy", "response_format": "pcm", "stream_format": "sse"}
    with httpx.stream("POST", f"{url}{SPEECH}", json=body, headers=HEADERS, timeout=60) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def test_a_killed_stage_answers_503_and_requests_during_its_restart_wait(placed_server):
    url = placed_server.url
    victim = stage_pid(placed_server)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        whole = pool.submit(speak, url, LONG)
        streamed = pool.submit(sse_events, url, LONG)
        deadline = time.monotonic() + 20
        while metric(url, "omni_stage_requests", stage="tts") < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert metric(url, "omni_stage_requests", stage="tts") == 2  # both are in the tts process
        os.kill(victim, signal.SIGKILL)

        with pytest.raises(openai.APIStatusError) as failed:
            whole.result(timeout=10)
        assert failed.value.status_code == 503 and failed.value.code == "stage_restarting"
        assert "stage 'tts' failed: stage process died (exit code -9); it is being restarted" in failed.value.message
        assert int(failed.value.response.headers["Retry-After"]) >= 1
        last = streamed.result(timeout=10)[-1]
        assert last["type"] == "error" and last["error"]["code"] == "stage_restarting", last

        # sent while the stage restarts (it takes longer than these round trips)
        sent = time.monotonic()
        patient = pool.submit(speak, url, "after the restart")  # the server's 30 s deadline
        hasty = pool.submit(speak, url, "in a hurry", "0.3")
        with pytest.raises(openai.APIStatusError) as late:
            hasty.result(timeout=10)
        assert late.value.status_code == 503 and late.value.code == "stage_restarting"
        assert "deadline passed while it waited" in late.value.message
        assert int(late.value.response.headers["Retry-After"]) >= 1
        spoken = patient.result(timeout=40)
        waited = time.monotonic() - sent
    assert len(spoken.content) == len(b"after the restart") * 400 * 2
    assert stage_pid(placed_server) != victim
    assert metric(url, "omni_stage_restarts_total", stage="tts") == 1
    assert metric(url, "omni_requests_total", endpoint=SPEECH, status="503") == 2
    assert metric(url, "omni_running_requests") == 0
    print(f"a request sent during the restart waited {waited:.2f} s")
