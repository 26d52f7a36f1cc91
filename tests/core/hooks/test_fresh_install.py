"""A new user's path: `pip install ./core` into a new virtual environment gives a working `omni`."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_pip_install_core_into_a_new_venv_lists_the_builtins(tmp_path):
    venv = tmp_path / "venv"
    # The packages of the environment running the tests stand in for the registry: the
    # dependencies are already on disk there. --system-site-packages alone sees the base
    # interpreter's, which in a virtual environment (as the README sets up) has no torch.
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    inner = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True).stdout.strip()
    outer = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], *site.getsitepackages()])
    (Path(inner) / "outer-environment.pth").write_text("\n".join(outer) + "\n")  # after the new venv's own
    # The wheel is built by this Python's setuptools (a new venv's bundled one may be too old to build).
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--wheel-dir", str(wheels), str(ROOT / "core")], check=True, capture_output=True, cwd=tmp_path)
    (wheel,) = wheels.glob("omni_core-*.whl")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", str(wheel)], check=True, capture_output=True, cwd=tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMNI_PLUGINS")}
    env["OMNI_PLUGINS"] = ""
    out = subprocess.run([str(venv / "bin" / "omni"), "plugins", "list", "--json"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    items = {item["name"]: item for item in json.loads(out.stdout)}
    assert set(items) == {"platforms", "transports", "engines"}
    assert all(item["status"] == "ok" and item["dist"] == "omni-core" for item in items.values())
    version = subprocess.run([str(venv / "bin" / "omni"), "--version"], env=env, capture_output=True, text=True)
    assert version.stdout.strip() == "omni, version 0.1.0"
    # the installed copy, not the source tree, answered
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import omni_core; print(omni_core.__file__)"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert str(venv) in where.stdout
    # the host kernels' C source ships in the wheel and builds from the installed copy
    env["OMNI_CACHE"] = str(tmp_path / "cache")
    built = subprocess.run([str(venv / "bin" / "python"), "-c", "from omni_core.models.native import paged_decode; print(paged_decode.available())"],
                           env=env, capture_output=True, text=True, cwd=tmp_path)
    assert built.stdout.strip() == "True", built.stderr
    assert len(list((tmp_path / "cache" / "native").glob("paged_decode-*.so"))) == 1
    # the playground's page and files ship in the wheel (package data): the installed copy serves them
    shipped = subprocess.run([str(venv / "bin" / "python"), "-c", "from omni_core.serve import playground; "
                              "print(sorted(playground.ASSETS), (playground.STATIC / 'playground.html').is_file(), playground.STATIC)"],
                             env=env, capture_output=True, text=True, cwd=tmp_path)
    assert str(venv) in shipped.stdout and "'main.js'" in shipped.stdout and "True" in shipped.stdout, shipped.stderr
