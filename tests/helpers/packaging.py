"""Install real distributions into throwaway folders and run the real `omni` command against them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def pip_install_target(packages: list[Path | str], target: Path) -> None:
    """``pip install --target``: the packages' dist-info lands in ``target``, so their entry points
    are found once ``target`` is on PYTHONPATH."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--target", str(target), *map(str, packages)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)


def env_with_path(*paths: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OMNI_PLUGINS", None)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def run_omni(args: list[str], env: dict[str, str], python: str = sys.executable) -> subprocess.CompletedProcess:
    return subprocess.run([python, "-m", "omni_core.cli", *args], env=env, capture_output=True, text=True, timeout=120)


def plugins_json(env: dict[str, str], python: str = sys.executable) -> list[dict]:
    result = run_omni(["plugins", "list", "--json"], env, python)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
