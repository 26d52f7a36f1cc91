"""Real `omni serve` subprocesses on 127.0.0.1 for end-to-end tests of any family."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.helpers.packaging import env_with_path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OmniServer:
    """``omni serve --family FAMILY ARGS...`` with its log in ``workdir``; presets and saved state
    go to ``workdir/cache`` unless ``env`` sets OMNI_CACHE. ``site`` folders go on PYTHONPATH (plugins installed with
    ``pip install --target``); ``env`` adds variables (OMNI_PLUGINS selects the plugins)."""

    def __init__(self, family: str, workdir: Path, *args: str, site: tuple[Path, ...] = (), **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"server-{self.port}.log"
        self._log = open(self.log_path, "w+")  # noqa: SIM115 - open for the server's lifetime
        command = [
            sys.executable,
            "-m",
            "omni_core.cli",
            "serve",
            "--family",
            family,
            "--port",
            str(self.port),
            *args,
        ]
        self.process = subprocess.Popen(
            command,
            env=env_with_path(*site, **{"OMNI_CACHE": str(workdir / "cache"), **env}),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-4000:]

    def wait_ready(self, timeout_s: float = 120.0) -> OmniServer:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"omni serve exited with {self.process.returncode}:\n{self.log()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        raise RuntimeError(f"omni serve not ready after {timeout_s} s:\n{self.log()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            return self.process.wait(timeout=timeout_s)
        finally:
            self._log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
