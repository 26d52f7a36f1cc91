"""`omni serve` as a process: exit codes, SIGTERM draining, and saved voices across a restart."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time

import httpx
import pytest

from tests.core.serve.server import API_KEY, ServerProcess, tone_wav
from tests.helpers.packaging import env_with_path, run_omni

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def test_unknown_family_lists_installed_ones(testfamily_site):
    result = run_omni(
        ["serve", "--family", "nope"], env_with_path(testfamily_site, OMNI_PLUGINS="testfamily")
    )
    assert result.returncode == 2
    assert "unknown family 'nope'" in result.stderr and "testfamily" in result.stderr


def test_unusable_device_exits_2(testfamily_site):
    result = run_omni(
        ["serve", "--family", "testfamily", "--preset", "tiny", "--device", "tpu"],
        env_with_path(testfamily_site, OMNI_PLUGINS="testfamily"),
    )
    assert result.returncode == 2 and "--device tpu" in result.stderr and "cpu" in result.stderr


def test_offline_without_checkpoint_exits_2_naming_the_way_out(testfamily_site, tmp_path):
    env = env_with_path(
        testfamily_site, OMNI_PLUGINS="testfamily", HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf")
    )
    result = run_omni(["serve", "--family", "testfamily"], env)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # the starting line, then the error in one line
    assert len(lines) == 2 and lines[0].startswith("omni serve: starting testfamily")
    assert "--model" in lines[1] and "--preset tiny" in lines[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port", "70000"], "70000 is not in the range 1<=x<=65535"),
        (["--max-upload-mb", "nan"], "'nan' is not a finite number"),
        (["--drain-seconds", "inf"], "'inf' is not a finite number"),
        (["--host", "no such host!"], "--host no such host!:"),
        (["--api-key", " "], "--api-key (or OMNI_API_KEY) is empty"),
        (["--port", "{busy}"], "Address already in use"),
        (["--stage-device", "vocoder=cpu"], "--stage-device: no stage named 'vocoder'; the testfamily stages are"),
    ],
    ids=["port out of range", "nan limit", "inf grace", "unresolvable host", "empty api key", "port in use", "unknown stage"],
)
def test_bad_serving_arguments_exit_2_in_one_line_before_loading(testfamily_site, args, message):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        args = [arg.format(busy=busy.getsockname()[1]) for arg in args]
        result = run_omni(
            ["serve", "--family", "testfamily", "--preset", "tiny", *args], env_with_path(testfamily_site, OMNI_PLUGINS="testfamily")
        )
    lines = [line for line in result.stderr.splitlines() if line.strip() and "Usage:" not in line and "Try '" not in line]
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert message in lines[-1] and "Traceback" not in result.stderr  # the error is one line (after progress lines)
    assert "loading" not in result.stderr  # refused before the model loads


def _expect_loading(server: ServerProcess) -> None:
    """While the stages load, /health and requests answer 503 instead of hanging."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            health = httpx.get(f"{server.url}/health", timeout=2)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    assert health.status_code == 503 and health.json()["status"] == "loading"
    early = httpx.post(
        f"{server.url}/v1/audio/speech",
        headers=HEADERS,
        timeout=5,
        json={"model": "testfamily", "input": "too early", "voice": "alloy"},
    )
    assert early.status_code == 503 and early.json()["error"]["code"] == "not_ready"
    models = httpx.get(f"{server.url}/v1/models", headers=HEADERS, timeout=5)  # the same story as /health
    assert models.status_code == 503 and models.json()["error"]["code"] == "not_ready"


def _sse_speech(url: str, text: str, outcome: dict) -> None:
    body = {
        "model": "testfamily",
        "input": text,
        "voice": "alloy",
        "response_format": "pcm",
        "stream_format": "sse",
    }
    with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, headers=HEADERS, timeout=60) as r:
        outcome["status"] = r.status_code
        events = []
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                outcome["started"] = True
        outcome["last"] = events[-1]


def _raw_speech(url: str, text: str, outcome: dict) -> None:
    body = {"model": "testfamily", "input": text, "voice": "alloy", "response_format": "pcm", "stream_format": "audio"}
    try:
        with httpx.stream("POST", f"{url}/v1/audio/speech", json=body, headers=HEADERS, timeout=60) as r:
            for _ in r.iter_bytes():
                outcome["started"] = True
        outcome["end"] = "whole"
    except httpx.RemoteProtocolError:  # the chunked body ended without its terminator
        outcome["end"] = "cut"


def test_sigterm_drains_then_exits_0_and_voices_survive_restart(testfamily_site, tmp_path):
    voices = str(tmp_path / "voices")
    args = ("--api-key", API_KEY, "--voices-dir", voices, "--drain-seconds", "1.5")
    server = ServerProcess(testfamily_site, tmp_path, *args, step_ms=20).wait_ready()
    try:
        saved = httpx.post(
            f"{server.url}/v1/audio/voices",
            headers=HEADERS,
            data={"name": "keeper", "text": "a tone"},
            files={"file": ("ref.wav", tone_wav(1.0), "audio/wav")},
            timeout=30,
        ).json()
        short, long, raw = {}, {}, {}
        threads = [
            threading.Thread(target=_sse_speech, args=(server.url, text, out))
            for text, out in (("Short enough to finish.", short), ("Far too long to finish. " * 60, long))
        ] + [threading.Thread(target=_raw_speech, args=(server.url, "Far too long to finish. " * 60, raw))]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while not (short.get("started") and long.get("started") and raw.get("started")) and time.monotonic() < deadline:
            time.sleep(0.02)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 503  # draining
        refused = httpx.post(
            f"{server.url}/v1/audio/speech",
            headers=HEADERS,
            timeout=5,
            json={"model": "testfamily", "input": "new", "voice": "alloy"},
        )
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        for thread in threads:
            thread.join(timeout=30)
        assert short["last"]["type"] == "speech.audio.done"  # finished within the grace period
        assert long["last"]["type"] == "error" and long["last"]["error"]["code"] == "aborted"
        assert raw["end"] == "cut"  # a raw stream cannot say why: it is cut
        assert server.process.wait(timeout=30) == 0
        log = server.log_path.read_text()
        cut = [line for line in log.splitlines() if " cut after " in line]
        assert len(cut) == 1 and "INFO omni.serve" in cut[0] and cut[0].endswith("request aborted: the server is shutting down"), log
        assert "Traceback" not in log, log  # said in that one line
    finally:
        server.kill()

    args = ("--voices-dir", voices, "--drain-seconds", "1.5")  # the key now comes from OMNI_API_KEY
    again = ServerProcess(
        testfamily_site, tmp_path, *args, OMNI_TESTFAMILY_LOAD_MS="3000", OMNI_API_KEY=API_KEY
    )
    try:
        _expect_loading(again)
        again.wait_ready()
        assert httpx.get(f"{again.url}/v1/audio/voices", timeout=10).status_code == 401
        listed = httpx.get(f"{again.url}/v1/audio/voices", headers=HEADERS, timeout=10).json()["data"]
        assert saved["id"] in [v["id"] for v in listed]
        spoken = httpx.post(
            f"{again.url}/v1/audio/speech",
            headers=HEADERS,
            timeout=30,
            json={"model": "testfamily", "input": "still here", "voice": "keeper", "response_format": "pcm"},
        )
        assert spoken.status_code == 200 and len(spoken.content) == len(b"still here") * 400 * 2
    finally:
        assert again.stop() == 0


def test_malformed_placement_exits_2(testfamily_site):
    result = run_omni(
        ["serve", "--family", "testfamily", "--preset", "tiny", "--placement", "tts"],
        env_with_path(testfamily_site, OMNI_PLUGINS="testfamily"),
    )
    assert result.returncode == 2
    assert "--placement takes STAGE=VALUE, got 'tts'" in result.stderr


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def test_placement_runs_one_stage_in_its_own_process(testfamily_site, tmp_path):
    server = ServerProcess(testfamily_site, tmp_path, "--api-key", API_KEY, "--placement", "tts=process")
    try:
        server.wait_ready(timeout_s=120)
        children = _children(server.process.pid)
        commands = [open(f"/proc/{child}/cmdline").read() for child in children]
        assert any("multiprocessing" in command for command in commands), commands
        reply = httpx.post(f"{server.url}/v1/audio/speech", headers=HEADERS, timeout=60,
                           json={"model": "testfamily", "input": "placed elsewhere", "voice": "alloy",
                                 "response_format": "pcm"})
        assert reply.status_code == 200, reply.text
        assert len(reply.content) > 1000
    finally:
        assert server.stop() == 0, server.log()
    deadline = time.monotonic() + 10  # the stage process and multiprocessing's tracker exit after the server
    while [c for c in children if _alive(c)] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [c for c in children if _alive(c)]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_malformed_family_option_exits_2(testfamily_site):
    result = run_omni(
        ["serve", "--family", "testfamily", "--preset", "tiny", "--option", "max_batch"],
        env_with_path(testfamily_site, OMNI_PLUGINS="testfamily"),
    )
    assert result.returncode == 2
    assert "--option takes KEY=VALUE, got 'max_batch'" in result.stderr


def test_an_option_the_family_does_not_declare_exits_2_naming_it(testfamily_site):
    env = env_with_path(testfamily_site, OMNI_PLUGINS="testfamily")
    result = run_omni(["serve", "--family", "testfamily", "--preset", "tiny", "--option", "max_btch=4"], env)
    assert result.returncode == 2
    assert "family 'testfamily' has no option 'max_btch'; its options: batch_window_ms, max_batch" in result.stderr
    assert "Traceback" not in result.stderr
    # the first line comes before the slow imports, saying what is starting
    assert result.stderr.splitlines()[0] == "omni serve: starting testfamily (tiny preset) for http://127.0.0.1:8000"


def test_omni_families_lists_families_and_one_familys_options(testfamily_site):
    env = env_with_path(testfamily_site, OMNI_PLUGINS="testfamily")
    one = run_omni(["families", "testfamily"], env)
    assert one.returncode == 0, one.stderr
    assert "tasks: speech, transcription, chat" in one.stdout
    assert re.search(r"max_batch\s+requests a tts call takes \(16\)", one.stdout)
    listed = json.loads(run_omni(["families", "--json"], env).stdout)
    assert [f["name"] for f in listed] == ["testfamily"] and listed[0]["presets"] == ["tiny"]
    missing = run_omni(["families", "nope"], env)
    assert missing.returncode == 2 and "unknown family 'nope'" in missing.stderr


def test_a_model_path_that_does_not_exist_is_named_as_such(testfamily_site, tmp_path):
    env = env_with_path(testfamily_site, OMNI_PLUGINS="testfamily")
    missing = run_omni(["serve", "--family", "testfamily", "--model", "/no/such/dir"], env)
    assert missing.returncode == 2 and "model '/no/such/dir': no such directory" in missing.stderr
    assert "download" not in missing.stderr and "Traceback" not in missing.stderr
    afile = tmp_path / "weights.bin"
    afile.write_bytes(b"x")
    wrong = run_omni(["serve", "--family", "testfamily", "--model", str(afile)], env)
    assert wrong.returncode == 2 and "is a file, not a checkpoint directory" in wrong.stderr


def test_serve_without_a_family_lists_the_installed_ones(testfamily_site):
    result = run_omni(["serve"], env_with_path(testfamily_site, OMNI_PLUGINS="testfamily"))
    assert result.returncode == 2
    assert result.stderr.strip() == "omni serve: --family is required; installed families: testfamily"


def test_every_serve_option_says_what_it_does_and_devices_are_the_installed_platforms():
    import click
    from omni_core.hooks import get_plugin_manager
    from omni_core.serve.command import serve

    options = {param.name: param for param in serve.params if isinstance(param, click.Option)}
    assert all(option.help for option in options.values()), [name for name, o in options.items() if not o.help]
    assert all(platform in options["device"].help for platform in get_plugin_manager().platforms())
