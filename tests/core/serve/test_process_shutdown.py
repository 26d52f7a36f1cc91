"""A process-placed `omni serve` exits soon after SIGTERM: neither its stage processes nor the
server process wait for the interpreter's finalization once their work is done, and their atexit
handlers still run.

Finalization with torch and a model loaded took 1-2 s a process on a busy 2-core machine, and the
server stopped its stage processes one after the other, so a server of four stage processes took
5-17 s to exit (docs/runtime.md, "Shutdown"). Too close to a slow machine's own variation to
bound, so here the test family makes finalization take 10 s in every process that builds its
stages (``exit_probe``): a server that waited for it would take 10 s or more, the 3 s each stage
process was given before being terminated in between; one that does not takes about 1 s. The
bound sits between, far from both.
"""

from __future__ import annotations

import signal
import time

import httpx

from tests.core.serve.server import API_KEY, ServerProcess

FINALIZE_S = 10.0
EXIT_BOUND_S = 5.0


def _stage_processes(pid: int) -> list[int]:
    """The server's children that multiprocessing spawned (not its resource tracker)."""
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        children = [int(child) for child in handle.read().split()]
    return [child for child in children if "spawn_main" in open(f"/proc/{child}/cmdline").read()]


def test_a_process_placed_server_exits_on_sigterm_without_waiting_for_finalization(testfamily_site, tmp_path):
    markers = tmp_path / "atexit-markers"
    markers.mkdir()
    server = ServerProcess(
        testfamily_site, tmp_path, "--api-key", API_KEY, "--stage-mode", "process",
        OMNI_TESTFAMILY_FINALIZE_S=str(FINALIZE_S), OMNI_TESTFAMILY_EXIT_MARKERS=str(markers),
    )
    try:
        server.wait_ready(timeout_s=180)
        stages = _stage_processes(server.process.pid)
        assert len(stages) == 3, stages  # frontend, tts, listener
        reply = httpx.post(f"{server.url}/v1/audio/speech", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60,
                           json={"model": "testfamily", "input": "one reply, then stop", "voice": "alloy"})
        assert reply.status_code == 200, reply.text
        asked = time.monotonic()
        server.process.send_signal(signal.SIGTERM)
        code = server.process.wait(timeout=120)
        took = time.monotonic() - asked
    finally:
        server.stop()
    assert code == 0, server.log()
    assert took < EXIT_BOUND_S, f"exited {took:.1f} s after SIGTERM\n{server.log()}"
    assert {int(marker.name) for marker in markers.iterdir()} == {server.process.pid, *stages}
