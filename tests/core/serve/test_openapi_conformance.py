"""Real `omni serve` processes (cosyvoice3's tiny preset, whisper's bundled tiny.en) with an API
key, held to their own /openapi.json by schemathesis: every check (status codes, content types,
headers and bodies as declared, schema-invalid data refused, schema-valid data not refused for
its shape, 405s with a true Allow, the key not ignored), then the answers a fuzzer cannot reach
(audio that decodes, a voice that exists) sent by hand and checked the same way.

Bounded: --max-examples 150 gives about 2,500 generated cases a server (some 225 an operation
across schemathesis' phases), about 30 s for whisper and 60 s for cosyvoice3 on a busy 2-core
machine, under 3 minutes in all with the servers' start. A fixed seed makes a failure repeatable.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import soundfile as sf

from tests.helpers.server import OmniServer

schemathesis = pytest.importorskip("schemathesis")

API_KEY = "conformance-key"
HEADERS = {"Authorization": f"Bearer {API_KEY}"}
CONFIG = Path(__file__).with_name("schemathesis.toml")
MAX_EXAMPLES = 150


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """{family: server}, both started at once (their start is most of the wait)."""
    workdir = tmp_path_factory.mktemp("openapi-conformance")
    common = ("--api-key", API_KEY, "--max-running", "4")
    started = {
        "cosyvoice3": OmniServer(
            "cosyvoice3", workdir, "--preset", "tiny", *common, "--voices-dir", str(workdir / "voices"),
            OMNI_PLUGINS="cosyvoice3", OMP_NUM_THREADS="1",
        ),
        "whisper": OmniServer("whisper", workdir, *common, OMNI_PLUGINS="whisper", OMP_NUM_THREADS="1"),
    }
    try:
        for server in started.values():
            server.wait_ready(timeout_s=240)
        yield started
    finally:
        for server in started.values():
            server.stop()


def described(server: OmniServer, tmp_path: Path) -> Path:
    """The server's own API description (behind the key, as the server is started)."""
    assert httpx.get(f"{server.url}/openapi.json", timeout=10).status_code == 401
    path = tmp_path / "openapi.json"
    path.write_bytes(httpx.get(f"{server.url}/openapi.json", headers=HEADERS, timeout=10).content)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("family", ["cosyvoice3", "whisper"])
def test_schemathesis_finds_the_server_true_to_its_description(servers, family, tmp_path):
    server = servers[family]
    command = [
        sys.executable, "-m", "schemathesis.cli", "--config-file", str(CONFIG), "run", str(described(server, tmp_path)),
        "--url", server.url, "--header", f"Authorization: Bearer {API_KEY}", "--checks", "all",
        "--max-examples", str(MAX_EXAMPLES), "--seed", "41", "--workers", "1", "--generation-database", "none",
        "--request-timeout", "60", "--no-color",
    ]
    run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-12000:] + run.stderr[-4000:]
    generated = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    operations = sum(len(ops) for ops in json.loads(described(server, tmp_path).read_text())["paths"].values())
    assert generated and generated[1] == generated[2], run.stdout[-4000:]
    assert int(generated[1]) >= 100 * operations, run.stdout[-4000:]  # a few hundred on most operations
    assert server.process.poll() is None, server.log()


def _wav(seconds: float, rate: int) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    out = io.BytesIO()
    sf.write(out, (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), rate, format="WAV")
    return out.getvalue()


def _validated(server: OmniServer, schema, path: str, method: str, **case):
    """One request built by hand, its response checked against the description as in the run."""
    return schema[path][method].Case(**case).call_and_validate(base_url=server.url, headers=HEADERS)


def _media_type(reply) -> str:
    return reply.headers["content-type"][0].split(";")[0]  # schemathesis keeps each header's values


@pytest.mark.slow
def test_what_succeeds_is_described_too(servers, tmp_path):
    cosyvoice3, whisper = servers["cosyvoice3"], servers["whisper"]
    speech = schemathesis.openapi.from_path(described(cosyvoice3, tmp_path))
    body = {"model": "cosyvoice3", "input": "Hello there.", "voice": "default"}
    seen = set()
    for extra in ({"response_format": "wav"}, {"response_format": "pcm", "stream_format": "audio"}, {"stream_format": "sse"}):
        reply = _validated(cosyvoice3, speech, "/v1/audio/speech", "POST", body={**body, **extra})
        assert reply.status_code == 200, reply.text
        seen.add(_media_type(reply))
    assert seen == {"audio/wav", "audio/pcm", "text/event-stream"}
    saved = _validated(
        cosyvoice3, speech, "/v1/audio/voices", "POST", media_type="multipart/form-data",
        body={"name": "conformance", "text": "a steady tone", "file": _wav(1.0, 24000)},
    )
    assert saved.status_code == 200, saved.text
    deleted = _validated(cosyvoice3, speech, "/v1/audio/voices/{voice_id}", "DELETE", path_parameters={"voice_id": saved.json()["id"]})
    assert deleted.status_code == 200, deleted.text

    transcription = schemathesis.openapi.from_path(described(whisper, tmp_path))
    audio = _wav(1.0, 16000)

    def transcribe(form: dict) -> str:
        reply = _validated(
            whisper, transcription, "/v1/audio/transcriptions", "POST", media_type="multipart/form-data",
            body={"model": "whisper", "file": audio, **form},
        )
        assert reply.status_code == 200, reply.text
        return _media_type(reply)

    forms = [{"response_format": f} for f in ("json", "text", "srt", "vtt", "verbose_json")] + [{"stream": True}]
    with ThreadPoolExecutor(len(forms)) as pool:
        types = list(pool.map(transcribe, forms))
    assert types == ["application/json", "text/plain", "text/plain", "text/vtt", "application/json", "text/event-stream"]
    for path in ("/metrics", "/health", "/v1/models"):
        assert _validated(whisper, transcription, path, "GET").status_code == 200
