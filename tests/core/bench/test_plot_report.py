"""`omni bench serve --plot` and `omni bench plot` against a real `omni serve` of the tiny test
family: the HTML report holds one inline PNG per plot and the same numbers as the JSON."""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser

import pytest

from tests.core.serve.server import ServerProcess, install_testfamily

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """Streams in several chunks (5 ms a tts step), so that underrun has something to measure."""
    site = install_testfamily(tmp_path_factory.mktemp("plot-site"))
    process = ServerProcess(site, tmp_path_factory.mktemp("plot-server"), step_ms=5)
    try:
        yield process.wait_ready().url
    finally:
        assert process.stop() == 0, process.log()


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    path = tmp_path_factory.mktemp("plot-prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ("Good morning.", "See you soon.")))
    return str(path)


def omni(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omni_core.cli", "bench", *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "COLUMNS": "250", **(env or {})})


class ReportPage(HTMLParser):
    """What a browser would show: the images' sources and every table's cells, row by row."""

    def __init__(self, html: str):
        super().__init__()
        self.images: list[str] = []
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None

    def row(self, metric: str) -> list[list[str]]:
        """The cells after the metric's name, one list per table that has the metric."""
        return [cells[1:] for cells in self.rows if cells and cells[0] == metric]

    def pngs(self) -> list[bytes]:
        decoded = []
        for src in self.images:
            prefix, _, data = src.partition(",")
            assert prefix == "data:image/png;base64"  # inline: the page needs no other file
            decoded.append(base64.b64decode(data, validate=True))
        return decoded


def test_a_streamed_speech_run_writes_a_report_with_every_plot_and_its_numbers(server, prompts, tmp_path):
    out, page_path = tmp_path / "speech.json", tmp_path / "report.html"
    run = omni("serve", "--base-url", server, "--endpoint", "speech", "--concurrency", "1,2", "--num-requests", "4",
               "--dataset", prompts, "--json", str(out), "--plot", str(page_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"report written to {page_path}" in run.stdout
    result = json.loads(out.read_text())
    page = ReportPage(page_path.read_text())
    # first audio, latency, throughput, real-time factor, underrun: each one PNG that decodes.
    pngs = page.pngs()
    assert len(pngs) == 5 and all(png.startswith(PNG_SIGNATURE) and len(png) > 1000 for png in pngs)
    assert page.row("requests ok / sent") == [[f"{lv['completed']} / {lv['num_requests']}" for lv in result["levels"]]]
    assert page.row("latency p50/p95/p99 (ms)") == [[
        " / ".join(f"{lv['latency_ms'][p]:,.1f}" for p in ("p50", "p95", "p99")) for lv in result["levels"]]]
    assert [cells[1:] for cells in page.rows if cells and cells[0] == "metric"] == [["c=1", "c=2"]]
    assert not (tmp_path / "report.html.tmp").exists()


def test_two_results_compare_side_by_side(server, prompts, tmp_path):
    """Whole transcriptions next to streamed ones: no audio out, so no underrun plot; a table each."""
    for name, mode in (("whole", "--no-stream"), ("streamed", "--stream")):
        run = omni("serve", "--base-url", server, "--endpoint", "transcriptions", mode, "--num-requests", "3",
                   "--concurrency", "1,2", "--json", str(tmp_path / f"{name}.json"))
        assert run.returncode == 0, run.stdout + run.stderr
    page_path = tmp_path / "compare.html"
    run = omni("plot", str(tmp_path / "whole.json"), str(tmp_path / "streamed.json"), "-o", str(page_path))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "report of 2 runs written" in run.stdout
    html = page_path.read_text()
    page = ReportPage(html)
    # first output, latency, throughput, real-time factor (audio transcribed): no underrun.
    assert len(page.pngs()) == 4
    assert re.search(r"<h2>whole</h2>.*<h2>streamed</h2>", html, re.S)  # in the order given
    whole, streamed = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("whole", "streamed"))
    assert page.row("requests ok / sent") == [
        [f"{lv['completed']} / {lv['num_requests']}" for lv in r["levels"]] for r in (whole, streamed)]


def test_a_file_that_is_not_a_result_is_named_in_one_line(tmp_path):
    bad = tmp_path / "notes.json"
    bad.write_text('{"levels": [{"concurrency": 1}], "config": {"endpoint": "speech"}}')
    run = omni("plot", str(bad), "-o", str(tmp_path / "r.html"))
    assert run.returncode == 2
    assert f"{bad} is not a result of `omni bench serve --json`" in run.stderr
    assert "Traceback" not in run.stderr and not (tmp_path / "r.html").exists()


def test_without_matplotlib_the_report_is_refused_before_the_run(tmp_path):
    """A matplotlib that fails to import, put first on the path: exit 2 in one line, and no
    request is tried (the server address is closed, so trying would fail differently)."""
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    pythonpath = os.pathsep.join(filter(None, [str(shadow.parent), os.environ.get("PYTHONPATH")]))
    run = omni("serve", "--base-url", "http://127.0.0.1:9", "--model", "m", "--plot", str(tmp_path / "r.html"),
               env={"PYTHONPATH": pythonpath})
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert lines == ["omni bench: --plot: plots need matplotlib: pip install matplotlib "
                     "(or omni-core's extra: pip install './core[plot]')"]
    assert "could not" not in run.stdout
