from __future__ import annotations

import httpx
import pytest

from tests.core.serve.server import API_KEY, ServerProcess, install_testfamily


@pytest.fixture(scope="session")
def testfamily_site(tmp_path_factory):
    """The test family installed as a real distribution (its entry point found via dist-info)."""
    return install_testfamily(tmp_path_factory.mktemp("testfamily-site"))


@pytest.fixture(scope="session")
def api_server(testfamily_site, tmp_path_factory):
    """One `omni serve` for the HTTP tests: small limits so that 413 and 429 are reachable, and
    15 ms per tts step so that streams last long enough to overlap and to be cut."""
    workdir = tmp_path_factory.mktemp("http-api")
    proc = ServerProcess(
        testfamily_site,
        workdir,
        "--api-key",
        API_KEY,
        "--max-running",
        "4",
        "--max-queued",
        "8",
        "--max-input-chars",
        "2000",
        "--max-upload-mb",
        "1",
        "--max-audio-seconds",
        "20",
        "--voices-dir",
        str(workdir / "voices"),
        step_ms=15,
    )
    try:
        yield proc.wait_ready()
    finally:
        assert proc.stop() == 0, proc.log()


@pytest.fixture(autouse=True)
def stays_healthy(request):
    """Every test that used the shared server leaves it alive and healthy."""
    yield
    if "api_server" in request.fixturenames:
        server = request.getfixturevalue("api_server")
        assert server.process.poll() is None, server.log()
        assert httpx.get(f"{server.url}/health", timeout=5).status_code == 200
