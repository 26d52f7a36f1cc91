"""Start `omni serve`, wait until it is healthy, run `omni bench serve` against it, stop it.

One command per family for machines where nothing else is set up (the GPU box): the server's
log goes to ``--log``, the bench's JSON wherever its own ``--json`` says. ``start_server`` and
``stop_server`` serve the other benchmarks that need a server.

    python benchmarks/serve_bench.py --log serve.log \
        --serve "--family cosyvoice3 --preset full --device cuda --option dtype=bfloat16 --max-running 32" \
        --bench "--endpoint speech --concurrency 1,8,32 --num-requests 32 --json speech.json"

``--bench`` may be given several times (levels that need different request counts, say).
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import socket
import subprocess
import sys
import time

import httpx

OMNI = [sys.executable, "-m", "omni_core.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(serve_args: list[str], log=subprocess.DEVNULL, timeout_s: float = 600.0) -> tuple[subprocess.Popen, str]:
    """``omni serve SERVE_ARGS --port P`` on a free port, once /health answers: (process, base URL)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([*OMNI, "serve", *serve_args, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if server.poll() is not None:
            raise SystemExit(f"omni serve exited with {server.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                print(f"server ready in {time.monotonic() - start:.1f} s", flush=True)
                return server, url
        time.sleep(0.2)
    server.kill()
    raise SystemExit(f"omni serve was not ready after {timeout_s:.0f} s")


def stop_server(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        server.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", required=True, help="arguments of `omni serve` (no --port)")
    parser.add_argument("--bench", required=True, action="append",
                        help="arguments of `omni bench serve` (no --base-url); repeated: one run after another on the same server")
    parser.add_argument("--log", default="serve.log", help="where the server's output goes")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    args = parser.parse_args()
    with open(args.log, "w") as log:
        server, url = start_server(shlex.split(args.serve), log, args.ready_timeout)
        try:
            codes = [subprocess.call([*OMNI, "bench", "serve", "--base-url", url, *shlex.split(bench)]) for bench in args.bench]
            return max(codes)
        finally:
            stop_server(server)


if __name__ == "__main__":
    sys.exit(main())
