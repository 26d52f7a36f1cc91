"""``omni env`` as a user runs it: a real subprocess of the CLI, as text and as JSON."""

from __future__ import annotations

import json
import os
import sys

from tests.helpers.packaging import run_omni


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "OMNI_PLUGINS"}
    return {**env, **extra}


def test_json_report_names_versions_plugins_and_platforms():
    result = run_omni(["env", "--json"], _env(OMNI_PLUGINS="", OMNI_API_KEY="not-for-reports"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["omni_core"] == "0.1.0"
    assert report["python"] == sys.version.split()[0]
    assert report["packages"]["torch"].startswith(__import__("torch").__version__.split("+")[0])
    assert set(report["packages"]) >= {"torch", "transformers", "mlx", "onnxruntime"}
    assert report["cpu"]["usable_cores"] >= 1 and report["torch_build"]["threads"] >= 1
    assert {p["name"] for p in report["plugins"]} == {"platforms", "transports", "engines"}
    platforms = {p["name"]: p for p in report["platforms"]}
    assert set(platforms) == {"cpu", "cuda"}  # OMNI_PLUGINS="": the built-ins alone
    assert platforms["cpu"]["available"] and platforms["cpu"]["devices"][0]["total_bytes"] > 0
    assert platforms["cuda"]["available"] or platforms["cuda"]["reason"]
    assert report["auto_device"] in platforms
    assert report["environment"] == {"OMNI_PLUGINS": ""}  # a key is never reported


def test_text_report_is_one_block_to_paste():
    result = run_omni(["env"], _env())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["omni-core", "0.1.0"]
    assert any(line.startswith("torch ") for line in lines)
    assert "plugins" in lines and any(line.startswith("platforms (--device auto picks ") for line in lines)
    cpu = next(line for line in lines if line.split()[:1] == ["cpu"] and "available" in line)
    assert "gloo" in cpu and "sdpa attention" in cpu
