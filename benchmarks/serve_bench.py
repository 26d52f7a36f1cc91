"""Start `omni serve`, wait until it is healthy, run `omni bench serve` against it, stop it.

One command per family for machines where nothing else is set up (the GPU box): the server's
log goes to ``--log``, the bench's JSON wherever its own ``--json`` says.

    python benchmarks/serve_bench.py --log serve.log \
        --serve "--family cosyvoice3 --preset full --device cuda --option dtype=bfloat16 --max-running 32" \
        --bench "--endpoint speech --concurrency 1,8,32 --num-requests 32 --json speech.json"
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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_healthy(process: subprocess.Popen, url: str, timeout_s: float) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if process.poll() is not None:
            raise SystemExit(f"omni serve exited with {process.returncode} before it was ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return time.monotonic() - start
        time.sleep(0.2)
    raise SystemExit(f"omni serve was not ready after {timeout_s:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", required=True, help="arguments of `omni serve` (no --port)")
    parser.add_argument("--bench", required=True, help="arguments of `omni bench serve` (no --base-url)")
    parser.add_argument("--log", default="serve.log", help="where the server's output goes")
    parser.add_argument("--ready-timeout", type=float, default=600.0)
    args = parser.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    omni = [sys.executable, "-m", "omni_core.cli"]
    with open(args.log, "w") as log:
        server = subprocess.Popen([*omni, "serve", *shlex.split(args.serve), "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
        try:
            print(f"server ready in {wait_healthy(server, url, args.ready_timeout):.1f} s", flush=True)
            return subprocess.call([*omni, "bench", "serve", "--base-url", url, *shlex.split(args.bench)])
        finally:
            server.terminate()
            try:
                server.wait(timeout=60)
            except subprocess.TimeoutExpired:
                server.kill()


if __name__ == "__main__":
    sys.exit(main())
