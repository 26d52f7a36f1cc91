"""The real `omni` entry point, run as a subprocess: bad arguments and an absent server fail
clearly with exit status 2 and no traceback."""

import os
import socket
import subprocess
import sys


def _omni(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omni_core.cli", "bench", "serve", *args],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "250"})  # wide enough that messages stay on one line


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_bad_concurrency_is_a_usage_error():
    result = _omni("--base-url", "http://127.0.0.1:1", "--concurrency", "1,x")
    assert result.returncode == 2
    assert "comma-separated integers" in result.stderr


def test_unreachable_server_is_reported_in_one_line(tmp_path):
    out = tmp_path / "result.json"
    result = _omni("--base-url", f"http://127.0.0.1:{_closed_port()}/v1", "--json", str(out))
    assert result.returncode == 2
    assert "could not read the served model" in result.stdout and "pass --model" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    assert not out.exists()


def test_bad_dataset_names_the_line(tmp_path):
    dataset = tmp_path / "data.jsonl"
    dataset.write_text('{"text": "fine"}\n{"text": ""}\n')
    result = _omni("--base-url", f"http://127.0.0.1:{_closed_port()}", "--model", "m", "--dataset", str(dataset))
    assert result.returncode == 2
    assert "data.jsonl:2: the speech endpoint needs 'text'" in result.stdout


def test_a_json_path_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    # (it failed with a traceback after the whole benchmark had run, and its results were lost)
    result = _omni("--base-url", f"http://127.0.0.1:{_closed_port()}", "--model", "m", "--json", str(tmp_path / "no" / "x.json"))
    assert result.returncode == 2 and "cannot write into" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "could not" not in result.stdout  # no request was tried
