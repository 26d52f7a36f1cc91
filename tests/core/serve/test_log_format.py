"""One log format: `omni serve --log-format json` writes one JSON object a line, omni's records
and uvicorn's alike; the default text lines are whole (never wrapped); stage processes inherit
the choice through the environment."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import httpx

from tests.core.serve.server import API_KEY, ServerProcess


def _served_and_stopped(site, workdir, *args) -> list[str]:
    server = ServerProcess(site, workdir, "--api-key", API_KEY, *args)
    try:
        server.wait_ready()
        reply = httpx.post(
            f"{server.url}/v1/audio/speech",
            headers={"Authorization": f"Bearer {API_KEY}"},
            timeout=60,
            json={"model": "testfamily", "input": "a line to log", "voice": "alloy"},
        )
        assert reply.status_code == 200, reply.text
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    finally:
        server.stop()
    return [line for line in server.log_path.read_text().splitlines() if line.strip()]


def test_json_lines_from_omni_and_uvicorn(testfamily_site, tmp_path):
    lines = _served_and_stopped(testfamily_site, tmp_path, "--log-format", "json")
    records = []
    for line in lines:
        if line.startswith("omni serve: starting"):  # printed before logging is set up (slow imports follow)
            continue
        records.append(json.loads(line))  # every other line is one JSON object
    assert all({"time", "level", "logger", "message", "pid"} <= set(r) for r in records)
    loggers = {r["logger"] for r in records}
    assert {"omni.serve", "uvicorn.access", "uvicorn.error"} <= loggers, loggers
    assert any("POST /v1/audio/speech" in r["message"] for r in records if r["logger"] == "uvicorn.access")
    assert any(r["message"].startswith("serving 'testfamily' on http://127.0.0.1:") for r in records)


def test_text_lines_are_whole_and_alike(testfamily_site, tmp_path):
    lines = _served_and_stopped(testfamily_site, tmp_path)
    record = re.compile(
        r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: .+"
    )
    odd = [
        line for line in lines if not line.startswith("omni serve: starting") and not record.fullmatch(line)
    ]
    assert odd == []
    checkpoint = next(line for line in lines if ": checkpoint " in line)
    assert os.path.isdir(checkpoint.split(": checkpoint ", 1)[1])  # the whole path on one line
    assert any(" INFO uvicorn.access: " in line and "POST /v1/audio/speech" in line for line in lines)
    # a line as each stage is ready (loading is where a server's start takes its time)
    ready = [re.search(r"stage '(\w+)' ready in [\d.]+ s \((\d) of 3\)", line) for line in lines]
    ready = [m.groups() for m in ready if m]
    assert sorted(name for name, _ in ready) == ["frontend", "listener", "tts"]
    assert [count for _, count in ready] == ["1", "2", "3"]


def test_a_stage_process_logs_as_its_server_chose():
    script = "import logging; from omni_core import logs; logs.configure_from_environment(); logging.getLogger('omni.stage').warning('refused %s', 'r1')"
    env = {**os.environ, "OMNI_LOG_FORMAT": "json", "OMNI_LOG_LEVEL": "info"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    entry = json.loads(out.stderr.strip())
    assert (entry["level"], entry["logger"], entry["message"]) == ("WARNING", "omni.stage", "refused r1")
