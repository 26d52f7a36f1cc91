"""Real `omni serve` subprocesses of the tiny test family, for the serving tests."""

from __future__ import annotations

import contextlib
import io
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

from tests.helpers.packaging import FIXTURES, env_with_path, pip_install_target

API_KEY = "test-key"


def install_testfamily(target: Path) -> Path:
    if not (target / "omni_testfamily").exists():
        pip_install_target([FIXTURES / "omni-testfamily"], target)
    return target


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, site: Path, workdir: Path, *args: str, step_ms: int = 0, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"server-{self.port}.log"
        self._log = open(self.log_path, "w+")  # noqa: SIM115 - open for the server's lifetime
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "omni_core.cli",
                "serve",
                "--family",
                "testfamily",
                "--preset",
                "tiny",
                "--port",
                str(self.port),
                *args,
            ],
            env=env_with_path(
                site,
                OMNI_PLUGINS="testfamily",
                OMNI_CACHE=str(workdir / "cache"),
                OMNI_TESTFAMILY_STEP_MS=str(step_ms),
                **env,
            ),
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-4000:]

    def wait_ready(self, timeout_s: float = 90.0) -> ServerProcess:
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


def metric(url: str, name: str, **labels: str) -> float:
    """One sample of the server's /metrics (0 when absent)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def tone_wav(seconds: float, rate: int = 16000, fmt: str = "WAV", amplitude: float = 0.3) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    audio = (np.sin(2 * np.pi * 220 * t) * amplitude * (1 + t)).astype(np.float32) / (1 + seconds)
    out = io.BytesIO()
    sf.write(out, audio, rate, format=fmt)
    return out.getvalue()
