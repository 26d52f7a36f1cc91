"""The terminal side of a run: a progress bar per level, then one table of every level (whose rows
the HTML report shows too)."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from omni_core.bench.load import LoadPlan
from omni_core.bench.records import RequestRecord
from omni_core.bench.summary import LevelSummary


class RichReporter:
    """Shows progress while a level runs and prints each failure's reason once per kind."""

    def __init__(self, console: Console):
        self.console = console
        self._progress: Progress | None = None
        self._task = None
        self._seen_errors: set[str] = set()

    def level_started(self, plan: LoadPlan) -> None:
        rate = f", {plan.request_rate:g} req/s" if plan.request_rate else ""
        self._progress = Progress(
            TextColumn(f"concurrency {plan.concurrency}{rate}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"), TimeElapsedColumn(), console=self.console,
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task("requests", total=plan.num_requests, failed=0)

    def request_done(self, record: RequestRecord) -> None:
        failed = self._progress.tasks[0].fields["failed"] + (0 if record.ok else 1)
        self._progress.update(self._task, advance=1, failed=failed)
        if not record.ok and record.error_key not in self._seen_errors:
            self._seen_errors.add(record.error_key)
            self._progress.console.print(f"[yellow]{record.error_key}[/]: {record.detail}")

    def level_finished(self, summary: LevelSummary) -> None:
        self._progress.stop()
        self.console.print(
            f"concurrency {summary.concurrency}: {summary.completed}/{summary.num_requests} ok "
            f"in {summary.duration_s:.2f} s"
        )


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _triple(values: dict, digits: int = 1) -> str:
    return " / ".join(_fmt(values.get(k), digits) for k in ("p50", "p95", "p99"))


def level_label(level: dict) -> str:
    """``c=8``, or ``c=8 @ 4/s`` for an open loop: a level's column heading."""
    rate = f" @ {level['request_rate']:g}/s" if level["request_rate"] else ""
    return f"c={level['concurrency']}{rate}"


def speaks(result: dict) -> bool:
    """Whether the run measured audio coming out (speech, audio chat) rather than text."""
    config = result["config"]
    return config["endpoint"] == "speech" or bool(config.get("chat_audio"))


def run_title(result: dict) -> str:
    config = result["config"]
    mode = "stream" if config["stream"] else "no stream"
    return f"omni bench: {config['endpoint']} ({mode}) on {config['base_url']}, model {result['model']}"


def table_rows(result: dict) -> list[tuple[str, list[str]]]:
    """The numbers of every level as (metric, one cell per level): the terminal table and the HTML
    report show the same rows."""
    config = result["config"]
    first_output = "first audio" if speaks(result) else "first token"
    levels = result["levels"]
    rows: list[tuple[str, list[str]]] = []

    def row(label: str, render) -> None:
        rows.append((label, [render(level) for level in levels]))

    row("requests ok / sent", lambda lv: f"{lv['completed']} / {lv['num_requests']}")
    row("duration (s)", lambda lv: _fmt(lv["duration_s"], 2))
    row("request throughput (req/s)", lambda lv: _fmt(lv["request_throughput"], 2))
    has_audio = any(lv["output_audio_seconds"] or lv["input_audio_seconds"] for lv in levels)
    if has_audio:
        row("audio seconds / wall second", lambda lv: _fmt(lv["audio_seconds_per_second"], 2))
    if any(lv["output_tokens_per_second"] for lv in levels):
        row("output tokens / wall second", lambda lv: _fmt(lv["output_tokens_per_second"], 1))
    row(f"time to {first_output} p50/p95/p99 (ms)", lambda lv: _triple(lv["time_to_first_output_ms"]))
    row("latency p50/p95/p99 (ms)", lambda lv: _triple(lv["latency_ms"]))
    if has_audio:
        row("real-time factor mean", lambda lv: _fmt(lv["rtf"]["mean"], 3))
        row("real-time factor p50/p95/p99", lambda lv: _triple(lv["rtf"], 3))
    if config["stream"] and any(lv["output_audio_seconds"] for lv in levels):
        row("underrun total (s), requests", lambda lv: f"{_fmt(lv['underrun_s']['total'], 2)}, "
                                                         f"{lv['requests_with_underrun']}")
        row("underrun p50/p95/p99 (s)", lambda lv: _triple(lv["underrun_s"], 3))
        # the low tail matters: how close to a gap the worst streams came
        row("least buffer p1/p5/p50 (s)", lambda lv: " / ".join(
            _fmt(lv.get("min_buffer_s", {}).get(k), 2) for k in ("p1", "p5", "p50")))
    if any(lv["wer"] is not None for lv in levels):
        row("word error rate", lambda lv: "-" if lv["wer"] is None else f"{lv['wer']:.1%}")
    row("errors by status", lambda lv: ", ".join(f"{k}: {v}" for k, v in lv["errors"].items()) or "none")
    return rows


def results_table(result: dict) -> Table:
    """Rows are metrics and columns are concurrency levels, so three levels fit any terminal."""
    table = Table(title=run_title(result))
    table.add_column("metric", style="bold")
    for level in result["levels"]:
        table.add_column(level_label(level), justify="right")
    for label, cells in table_rows(result):
        table.add_row(label, *cells)
    return table
