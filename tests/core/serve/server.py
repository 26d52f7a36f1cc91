"""Real `omni serve` subprocesses of the tiny test family, for the serving tests."""

from __future__ import annotations

import io
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf

from tests.helpers.packaging import FIXTURES, pip_install_target
from tests.helpers.server import OmniServer

API_KEY = "test-key"


def install_testfamily(target: Path) -> Path:
    if not (target / "omni_testfamily").exists():
        pip_install_target([FIXTURES / "omni-testfamily"], target)
    return target


class ServerProcess(OmniServer):
    """The tiny test family served with these arguments; ``step_ms`` slows its model steps."""

    def __init__(self, site: Path, workdir: Path, *args: str, step_ms: int = 0, **env: str):
        super().__init__(
            "testfamily",
            workdir,
            "--preset",
            "tiny",
            *args,
            site=(site,),
            OMNI_PLUGINS="testfamily",
            OMNI_TESTFAMILY_STEP_MS=str(step_ms),
            **env,
        )

    def wait_ready(self, timeout_s: float = 90.0) -> ServerProcess:
        super().wait_ready(timeout_s)
        return self


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
