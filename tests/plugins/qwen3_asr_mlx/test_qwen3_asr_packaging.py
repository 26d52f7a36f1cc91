"""The distribution builds, declares mlx per platform (Metal wheel on macOS arm64, mlx[cpu] on
Linux) and registers its entry point."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

PLUGIN = Path(__file__).resolve().parents[3] / "plugins" / "omni-qwen3-asr-mlx"


def test_wheel_declares_mlx_per_platform(tmp_path):
    source = tmp_path / "source"  # a copy: the build writes its scratch folders next to the sources
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "-w", str(tmp_path), str(source)],
        check=True, capture_output=True, text=True,
    )
    wheel = next(tmp_path.glob("omni_qwen3_asr_mlx-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        entry_points = archive.read(next(n for n in names if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "[omni]" in entry_points and "qwen3-asr-mlx = omni_qwen3_asr_mlx.plugin" in entry_points
    assert "omni_qwen3_asr_mlx/engine.py" in names

    requirements = [Requirement(line.split(":", 1)[1].strip()) for line in metadata.splitlines()
                    if line.startswith("Requires-Dist:")]
    platforms = {
        "macos-arm64": {"sys_platform": "darwin", "platform_machine": "arm64"},
        "linux-x86_64": {"sys_platform": "linux", "platform_machine": "x86_64"},
        "linux-aarch64": {"sys_platform": "linux", "platform_machine": "aarch64"},
    }
    for name, environment in platforms.items():
        mlx = [r for r in requirements if r.name == "mlx" and (r.marker is None or r.marker.evaluate(environment))]
        assert len(mlx) == 1, name
        assert mlx[0].extras == (set() if name == "macos-arm64" else {"cpu"}), name
