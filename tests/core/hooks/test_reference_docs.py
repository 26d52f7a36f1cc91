"""The reference for plugin authors (mkdocs.yml, docs/reference/) builds from the code's
docstrings with warnings as errors, and says what the contract promises."""

import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

pytest.importorskip("mkdocstrings_handlers.python", reason="mkdocstrings-python is not installed (requirements-test.txt installs it)")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    return out


def page_text(site: Path, page: str) -> str:
    text = re.sub(r"<[^>]+>", " ", (site / page / "index.html").read_text())
    return re.sub(r"\s+", " ", html.unescape(text))


def test_every_hook_and_record_is_in_the_reference(site):
    contract = page_text(site, "contract")
    names = ["omni_families", "omni_engines", "omni_platforms", "omni_transports", "omni_stage_hooks", "FamilySpec", "ReferenceLimits", "TransportSpec", "InvalidInput", "PluginRecord"]
    assert [n for n in names if n not in contract] == []
    assert "cross_host" in contract and "split_speech" in contract  # fields show, documented or not


def test_the_reference_answers_what_plugin_authors_asked(site):
    stages, hooks, topology = page_text(site, "stages"), page_text(site, "engine-hooks"), page_text(site, "topology")
    assert "may run twice for one request" in stages  # a batch worker's release
    assert "may run more than once" in stages  # an AR worker's release
    assert "batch.sample_index[i]" in hooks  # the sample hook's rows
    assert '"input_tokens", "output_tokens"' in topology  # the usage keys a task returns
