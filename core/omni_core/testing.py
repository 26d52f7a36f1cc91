"""A testing kit for plugin authors: a pytest plugin that omni-core installs (entry point group
``pytest11``, name ``omni``), so a plugin's tests get these fixtures without importing anything:

- ``omni_plugin(name)`` -> the installed plugin's ``PluginRecord``, failing the test unless it
  loaded (status ``ok``).
- ``omni_pipeline(family, preset="tiny", options=None)`` -> the family's stage pipeline on that
  preset, started in this process (``pipeline.submit(inputs)`` yields its events); stopped after
  the test.
- ``omni_server(family, *serve_args, preset="tiny", api_key=None, **env)`` -> a real ``omni
  serve`` of the installed family on 127.0.0.1 and a free port, ready (``/health`` answered
  200); ``.url``, ``.log()``, ``.openai()`` (the official client, when ``openai`` is installed);
  stopped after the test.

``OmniServer`` is the same server for use outside pytest.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OmniServer:
    """``omni serve --family FAMILY ARGS...`` on 127.0.0.1 with its log in ``workdir``; presets
    and saved state go to ``workdir/cache`` unless ``env`` sets OMNI_CACHE. ``site`` folders go
    on PYTHONPATH (plugins installed with ``pip install --target``); ``env`` adds variables to
    this process's (OMNI_PLUGINS selects the plugins). ``api_key`` is what ``openai()`` sends; pass
    ``--api-key`` in ``args`` for the server to ask for one."""

    def __init__(self, family: str, workdir: Path, *args: str, site: tuple[Path, ...] = (), api_key: str | None = None, **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = Path(workdir) / f"server-{self.port}.log"
        self._log = open(self.log_path, "w+")  # noqa: SIM115 - open for the server's lifetime
        command = [sys.executable, "-m", "omni_core.cli", "serve", "--family", family, "--host", "127.0.0.1", "--port", str(self.port), *args]
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join([*map(str, site), environment.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        environment.update({"OMNI_CACHE": str(Path(workdir) / "cache"), **env})
        self.process = subprocess.Popen(command, env=environment, stdout=self._log, stderr=subprocess.STDOUT)

    def log(self) -> str:
        """The end of the server's output (for assertion messages)."""
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

    def openai(self, **kwargs: Any):
        """The official ``openai`` client for this server (no retries: a test sees each answer)."""
        from openai import OpenAI

        return OpenAI(base_url=f"{self.url}/v1", api_key=self.api_key or "unused", max_retries=0, **kwargs)

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


@pytest.fixture
def omni_plugin():
    def check(name: str):
        from omni_core.hooks import PluginManager

        records = {record.name: record for record in PluginManager().records}
        assert name in records, f"no installed plugin named {name!r}; installed: {sorted(records)}"
        record = records[name]
        assert record.status == "ok", f"plugin {name!r} did not load: {record.error}"
        return record

    return check


@pytest.fixture
def omni_pipeline(tmp_path) -> Iterator:
    started = []

    def start(family: str, preset: str = "tiny", options: dict[str, Any] | None = None):
        from omni_core.hooks import PluginManager
        from omni_core.pipeline import Pipeline

        manager = PluginManager()
        spec = manager.family(family)
        checkpoint = spec.presets[preset](str(tmp_path / f"{family}-{preset}"))
        pipeline = Pipeline(spec.build(checkpoint, dict(options or {})), plugin_manager=manager)
        started.append(pipeline)
        pipeline.start()
        return pipeline

    yield start
    for pipeline in started:
        pipeline.shutdown()


@pytest.fixture
def omni_server(tmp_path) -> Iterator:
    started: list[OmniServer] = []

    def start(family: str, *serve_args: str, preset: str | None = "tiny", api_key: str | None = None, ready_timeout_s: float = 180.0, **env: str):
        args = [*(("--preset", preset) if preset else ()), *(("--api-key", api_key) if api_key else ()), *serve_args]
        server = OmniServer(family, tmp_path, *args, api_key=api_key, **env)
        started.append(server)
        return server.wait_ready(ready_timeout_s)

    yield start
    for server in started:
        server.stop()
