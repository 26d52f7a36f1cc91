"""`omni bench serve` against a real `omni serve` of the tiny test family: the report's counts,
statuses and audio seconds must agree with what the server's own /metrics counted."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import soundfile
from omni_core.bench.dataset import spoken
from omni_core.bench.load import arrival_offsets
from prometheus_client.parser import text_string_to_metric_families

from tests.core.serve.server import ServerProcess, install_testfamily

API_KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
SPEECH = "/v1/audio/speech"
TRANSCRIPTIONS = "/v1/audio/transcriptions"
CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    return install_testfamily(tmp_path_factory.mktemp("bench-site"))


@pytest.fixture(scope="module")
def server(site, tmp_path_factory):
    """Two running and two queued, so that eight concurrent requests meet 429s; 5 ms per tts step,
    so that streams arrive in several chunks; a key, which the benchmark takes from OMNI_API_KEY."""
    workdir = tmp_path_factory.mktemp("bench-server")
    process = ServerProcess(site, workdir, "--max-running", "2", "--max-queued", "2", "--api-key", API_KEY, step_ms=5)
    try:
        yield process.wait_ready().url
    finally:
        assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def short_prompts(tmp_path_factory):
    """Short texts keep the speech runs quick; one row clones a voice from espeak-ng audio."""
    folder = tmp_path_factory.mktemp("prompts")
    reference = spoken("A short reference clip.", folder)
    rows = [{"text": "Good morning."}, {"text": "See you soon."}, {"text": "Thanks a lot."},
            {"text": "Copy my voice.", "reference_audio": reference.name, "reference_text": "A short reference clip."}]
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=10).text
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return values


def counted(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def statuses(before: dict, after: dict, endpoint: str) -> dict[str, int]:
    """Requests per status of one endpoint between two scrapes."""
    seen = {}
    for (name, labels), value in after.items():
        label = dict(labels)
        if name == "omni_requests_total" and label.get("endpoint") == endpoint:
            delta = int(value - before.get((name, labels), 0.0))
            if delta:
                seen[label["status"]] = delta
    return seen


def run_bench(url: str, *args: str, api_key: str | None = API_KEY) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "OMNI_API_KEY"}
    if api_key:
        env["OMNI_API_KEY"] = api_key
    return subprocess.run([sys.executable, "-m", "omni_core.cli", "bench", "serve", "--base-url", url, *args],
                          capture_output=True, text=True, timeout=120, env={**env, "COLUMNS": "200"})


def bench(url: str, tmp_path, *args: str) -> dict:
    out = tmp_path / "result.json"
    result = run_bench(url, "--json", str(out), *args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "omni bench" in result.stdout  # the table was printed
    return json.loads(out.read_text())


def totals(report: dict) -> dict[str, int]:
    """Statuses over all levels, as the report counts them, successes under "200"."""
    seen: dict[str, int] = {}
    for level in report["levels"]:
        for status, count in {"200": level["completed"], **level["errors"]}.items():
            if count:
                seen[status] = seen.get(status, 0) + count
    return seen


def check_level_numbers(level: dict) -> None:
    assert level["completed"] + level["failed"] == level["num_requests"]
    for key in ("time_to_first_output_ms", "latency_ms"):
        values = level[key]
        assert 0 < values["p50"] <= values["p95"] <= values["p99"]
    assert level["time_to_first_output_ms"]["p50"] <= level["latency_ms"]["p99"]
    assert level["request_throughput"] == pytest.approx(level["completed"] / level["duration_s"])


def server_sample_rate(url: str) -> int:
    voice = httpx.get(f"{url}/v1/audio/voices", headers=AUTH, timeout=10).json()["data"][0]["id"]
    response = httpx.post(f"{url}{SPEECH}", headers=AUTH, timeout=60,
                          json={"model": "testfamily", "input": "rate", "voice": voice, "response_format": "wav"})
    response.raise_for_status()
    return soundfile.info(io.BytesIO(response.content)).samplerate


def test_streamed_speech_agrees_with_server_metrics(server, short_prompts, tmp_path):
    rate = server_sample_rate(server)
    before = scrape(server)
    report = bench(server, tmp_path, "--endpoint", "speech", "--concurrency", "1,8", "--num-requests", "8",
                   "--warmup", "0", "--sample-rate", str(rate), "--dataset", short_prompts, "--detailed")
    after = scrape(server)
    assert report["warmup_requests"] == 0
    solo, crowded = report["levels"]
    assert solo["completed"] == 8 and solo["errors"] == {}
    assert set(crowded["errors"]) <= {"429"} and crowded["completed"] >= 4  # 2 running + 2 queued fit
    assert totals(report) == statuses(before, after, SPEECH)
    audio = sum(level["output_audio_seconds"] for level in report["levels"])
    assert audio > 0
    assert audio == pytest.approx(counted(before, after, "omni_audio_seconds_total", endpoint=SPEECH), rel=1e-3)
    for level in report["levels"]:
        check_level_numbers(level)
        assert level["underrun_s"]["total"] >= 0
        assert level["rtf"]["mean"] > 0
        rows = level["requests"]
        ok = [row for row in rows if row["status"] == 200]
        assert len(rows) == level["num_requests"] and len(ok) == level["completed"]
        assert sum(row["output_audio_seconds"] for row in ok) == pytest.approx(level["output_audio_seconds"])
        assert all(row["audio_chunks"] > 1 for row in ok)  # audio arrived as a stream, not one blob
        for row in rows:
            if row["status"] == 429:
                assert row["error"] == "http" and row["detail"].startswith("429: ")


def test_every_speech_mode_measures_the_same_audio(server, short_prompts, tmp_path):
    """Same seed, same prompts: the PCM stream, the SSE stream and whole wav files carry the same
    audio, and the sample rate learned by the probe is the server's."""
    common = ["--endpoint", "speech", "--num-requests", "6", "--seed", "7", "--dataset", short_prompts]
    pcm = bench(server, tmp_path, *common)
    sse = bench(server, tmp_path, *common, "--stream-format", "sse")
    before = scrape(server)
    whole = bench(server, tmp_path, *common, "--no-stream")
    after = scrape(server)
    assert pcm["sample_rate"] == server_sample_rate(server)
    assert pcm["warmup_requests"] == 1
    seconds = [r["levels"][0]["output_audio_seconds"] for r in (pcm, sse, whole)]
    assert seconds[0] > 0 and seconds == pytest.approx([seconds[0]] * 3, rel=1e-3)
    # Without streaming there is no sample-rate probe: one warm-up, then the six measured.
    assert whole["warmup_requests"] == 1
    assert statuses(before, after, SPEECH) == {"200": 7}


def test_transcriptions_count_the_audio_they_send(server, tmp_path):
    before = scrape(server)
    report = bench(server, tmp_path, "--endpoint", "transcriptions", "--num-requests", "6", "--warmup", "0",
                   "--request-rate", "20", "--concurrency", "2")
    after = scrape(server)
    level = report["levels"][0]
    assert level["completed"] == 6 and level["request_rate"] == 20
    # The open loop waited for the last seeded arrival before sending it.
    assert level["duration_s"] >= arrival_offsets(6, 20.0, seed=0)[-1]
    assert 0 <= level["wer"]  # the built-in clips know their text; the toy listener's words are scored
    check_level_numbers(level)
    assert totals(report) == statuses(before, after, TRANSCRIPTIONS)
    assert level["input_audio_seconds"] == pytest.approx(
        counted(before, after, "omni_audio_seconds_total", endpoint=TRANSCRIPTIONS), rel=1e-2)


def test_streamed_chat_and_bad_requests_by_status(server, tmp_path):
    clip = spoken("What time is it?", tmp_path)
    dataset = tmp_path / "chat.jsonl"
    dataset.write_text(json.dumps({"text": "Hello!"}) + "\n" + json.dumps({"audio": clip.name}) + "\n")
    before = scrape(server)
    chat = bench(server, tmp_path, "--endpoint", "chat", "--num-requests", "4", "--warmup", "0",
                 "--dataset", str(dataset))
    bad_voice = bench(server, tmp_path, "--endpoint", "speech", "--num-requests", "5", "--warmup", "0",
                      "--sample-rate", "16000", "--voice", "no-such-voice")
    after = scrape(server)
    assert chat["levels"][0]["completed"] == 4
    # Two of the four spoke their message as an input_audio part.
    assert chat["levels"][0]["input_audio_seconds"] == pytest.approx(2 * soundfile.info(str(clip)).duration)
    check_level_numbers(chat["levels"][0])
    assert totals(chat) == statuses(before, after, CHAT)
    assert bad_voice["levels"][0]["errors"] == {"400": 5}
    assert totals(bad_voice) == statuses(before, after, SPEECH) == {"400": 5}
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


def test_a_missing_key_is_named(server):
    result = run_bench(server, "--num-requests", "1", api_key=None)
    assert result.returncode == 2
    assert "wants an API key: pass --api-key or set OMNI_API_KEY" in result.stdout


def test_a_server_that_dies_mid_run_is_reported_not_fatal(site, tmp_path):
    doomed = ServerProcess(site, tmp_path, "--api-key", API_KEY, step_ms=20).wait_ready()
    out = tmp_path / "result.json"
    run = subprocess.Popen(
        [sys.executable, "-m", "omni_core.cli", "bench", "serve", "--base-url", doomed.url, "--json", str(out),
         "--num-requests", "40", "--concurrency", "2", "--api-key", API_KEY],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        # Five responses started: the sample-rate probe, and four streams, of which (two at a
        # time) the first two have finished.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and counted({}, scrape(doomed.url), "omni_requests_total",
                                                      endpoint=SPEECH, status="200") < 5:
            time.sleep(0.1)
    finally:
        doomed.kill()
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 0, output
    level = json.loads(out.read_text())["levels"][0]
    assert level["completed"] + level["failed"] == 40
    assert level["completed"] >= 2 and level["failed"] >= 1
    assert set(level["errors"]) <= {"connect", "protocol"}
