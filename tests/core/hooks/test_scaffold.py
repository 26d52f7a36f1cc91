"""`omni plugins new` writes a package that installs, lists with status ok, and passes its own test."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers.packaging import env_with_path, pip_install_target, plugins_json, run_omni


@pytest.mark.parametrize("kind", ["family", "platform"])
def test_new_plugin_installs_lists_and_passes_its_test(tmp_path, kind):
    name = f"acme-{kind}"
    result = run_omni(["plugins", "new", name, "--kind", kind, "--dir", str(tmp_path)], env_with_path())
    assert result.returncode == 0, result.stderr
    package = tmp_path / f"omni-{name}"
    assert {p.name for p in package.iterdir()} >= {"pyproject.toml", "README.md", "tests"}

    site = tmp_path / "site"
    pip_install_target([package], site)
    env = env_with_path(site, OMNI_PLUGINS=name)
    record = {item["name"]: item for item in plugins_json(env)}[name]
    assert record["status"] == "ok", record["error"]
    assert record["dist"] == f"omni-{name}"
    provided = record["provides"]["families" if kind == "family" else "platforms"]
    assert provided == [name]

    test = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(package / "tests")],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert test.returncode == 0, test.stdout + test.stderr
    assert ("2 passed" if kind == "family" else "1 passed") in test.stdout  # the family's: in process, and served


def test_new_plugin_refuses_bad_names_and_existing_folders(tmp_path):
    bad = run_omni(["plugins", "new", "Acme TTS", "--dir", str(tmp_path)], env_with_path())
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "lowercase" in bad.stderr
    long = run_omni(["plugins", "new", "a" * 300, "--dir", str(tmp_path)], env_with_path())  # was: File name too long
    assert long.returncode == 2 and "1-64" in long.stderr and "Traceback" not in long.stderr
    assert run_omni(["plugins", "new", "acme", "--dir", str(tmp_path)], env_with_path()).returncode == 0
    again = run_omni(["plugins", "new", "acme", "--dir", str(tmp_path)], env_with_path())
    assert again.returncode == 2 and "already exists" in again.stderr


def test_the_next_step_it_prints_names_the_package_by_path(tmp_path):
    """`pip install omni-acme` would look for a package on the index: the hint is a path."""
    result = subprocess.run([sys.executable, "-m", "omni_core.cli", "plugins", "new", "acme"], cwd=tmp_path,
                            env=env_with_path(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "next: pip install ./omni-acme && omni plugins list"
    assert (tmp_path / "omni-acme" / "pyproject.toml").exists()
