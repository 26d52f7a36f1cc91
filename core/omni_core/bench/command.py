"""``omni bench serve``: load-test a running server over HTTP and report the audio metrics."""

from __future__ import annotations

import json
import os
import sys

import click
from rich.console import Console

from omni_core.bench.dataset import ENDPOINTS, DatasetError


def _concurrency_levels(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers such as 1,8,32, got {value!r}") from None
    if not levels or min(levels) < 1:
        raise click.BadParameter(f"concurrency levels must be positive integers, got {value!r}")
    return levels


def _json_object(ctx: click.Context, param: click.Parameter, value: str | None) -> dict:
    if not value:
        return {}
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as exc:
        raise click.BadParameter(f"not JSON: {exc.msg}") from None
    if not isinstance(parsed, dict):
        raise click.BadParameter("expected a JSON object such as '{\"seed\": 1}'")
    return parsed


@click.group()
def bench() -> None:
    """Benchmark a running server."""


@bench.command("serve")
@click.option("--base-url", required=True, help="Server root, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine).")
@click.option("--api-key", envvar="OMNI_API_KEY", default=None, help="Bearer key (or OMNI_API_KEY).")
@click.option("--endpoint", type=click.Choice(ENDPOINTS), default="speech", show_default=True)
@click.option("--concurrency", default="1", show_default=True, callback=_concurrency_levels,
              help="Comma-separated levels, e.g. 1,8,32; each runs --num-requests requests.")
@click.option("--num-requests", type=click.IntRange(min=1), default=16, show_default=True,
              help="Requests per concurrency level.")
@click.option("--stream/--no-stream", default=True, show_default=True)
@click.option("--stream-format", type=click.Choice(["audio", "sse"]), default="audio", show_default=True,
              help="Speech streams: chunked PCM body, or speech.audio.delta events.")
@click.option("--dataset", type=click.Path(dir_okay=False), default=None,
              help="JSONL: text; audio path; reference_audio + reference_text. Default: built-in prompts.")
@click.option("--request-rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Open loop: Poisson arrivals at this many requests/s, capped by the concurrency. "
                   "Default: closed loop.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seeds prompt order and arrivals.")
@click.option("--model", default=None, help="The model field; default: the first of /v1/models.")
@click.option("--voice", default=None, help="Voice for speech (and audio chat).")
@click.option("--sample-rate", type=click.IntRange(min=1), default=None,
              help="Rate of streamed PCM; default: the X-Sample-Rate header, else learned from one wav request.")
@click.option("--chat-audio", is_flag=True, help="Chat asks for text and audio output.")
@click.option("--extra-body", callback=_json_object, default=None,
              help="JSON object merged into each JSON request body, e.g. '{\"seed\": 1}'.")
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True,
              help="Requests sent before measuring (not counted).")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=0, min_open=True), default=300.0,
              show_default=True, help="Seconds one request may take.")
@click.option("--detailed", is_flag=True, help="Add each request's numbers to the JSON (under levels[].requests).")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, allow_dash=True), default=None,
              help="Write the results as JSON to this file ('-' for stdout).")
@click.option("--plot", "plot_out", type=click.Path(dir_okay=False), default=None,
              help="Also write an HTML report with plots to this file (needs matplotlib).")
def serve(json_out: str | None, plot_out: str | None, **options) -> None:
    """Load-test a speech, transcription or chat endpoint of any OpenAI-compatible server."""
    from omni_core.bench.report import RichReporter, results_table
    from omni_core.bench.runner import BenchConfig, BenchError, run_benchmark

    base_url = options.pop("base_url").rstrip("/")
    if base_url.endswith("/v1"):
        base_url = base_url[: -len("/v1")]
    # With the JSON on stdout, the table and progress go to stderr so the JSON stays parseable.
    console = Console(stderr=json_out == "-")
    config = BenchConfig(base_url=base_url, concurrencies=options.pop("concurrency"), **options)
    # Found now, not after the whole run.
    if json_out and json_out != "-":
        _refuse_unwritable("--json", json_out)
    if plot_out:
        _refuse_unwritable("--plot", plot_out)
        _refuse_without_matplotlib("--plot")
    try:
        result = run_benchmark(config, RichReporter(console))
    except (BenchError, DatasetError) as exc:
        console.print(f"[red]error:[/] {exc}")
        sys.exit(2)
    except KeyboardInterrupt:
        console.print("interrupted: no results")
        sys.exit(130)
    console.print(results_table(result))
    if json_out == "-":
        click.echo(json.dumps(result, indent=2))
    elif json_out:
        tmp = f"{json_out}.tmp"
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)
        os.replace(tmp, json_out)
        console.print(f"results written to {json_out}")
    if plot_out:
        from omni_core.bench import html_report

        mode = "stream" if config.stream else "no stream"
        html_report.write(plot_out, [(f"{config.endpoint} ({mode})", result)])
        console.print(f"report written to {plot_out}")


@bench.command("plot")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The HTML report to write.")
def plot(results: tuple[str, ...], output: str) -> None:
    """Plot one or more `omni bench serve --json` results in one HTML report, runs side by side."""
    from omni_core.bench import html_report

    _refuse_unwritable("--output", output)
    _refuse_without_matplotlib("omni bench plot")
    runs = [(label, _load_result(path)) for label, path in zip(_labels(results), results, strict=True)]
    html_report.write(output, runs)
    click.echo(f"report of {len(runs)} run{'s' if len(runs) > 1 else ''} written to {output}")


def _refuse_unwritable(option: str, path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        click.echo(f"omni bench: {option} {path}: cannot write into {folder}", err=True)
        sys.exit(2)


def _refuse_without_matplotlib(what: str) -> None:
    from omni_core.bench.plots import PlotUnavailable, require_matplotlib

    try:
        require_matplotlib()
    except PlotUnavailable as exc:
        click.echo(f"omni bench: {what}: {exc}", err=True)
        sys.exit(2)


def _load_result(path: str) -> dict:
    """A result written by ``--json``; anything else is refused in one line."""
    from omni_core.bench.summary import LevelSummary

    level_keys = LevelSummary.__dataclass_fields__.keys()  # the table and the plots read them all
    try:
        with open(path, encoding="utf-8") as handle:
            result = json.load(handle)
        if not (isinstance(result, dict) and isinstance(result.get("config"), dict) and isinstance(result.get("levels"), list)):
            raise ValueError("it has no config and levels")
        missing = {"model"} - result.keys() or {"endpoint", "stream", "base_url"} - result["config"].keys()
        if missing:
            raise ValueError(f"it lacks {', '.join(sorted(missing))}")
        for level in result["levels"]:
            missing = level_keys - level.keys() if isinstance(level, dict) else level_keys
            if missing:
                raise ValueError(f"a level lacks {', '.join(sorted(missing))}")
    except (OSError, ValueError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        click.echo(f"omni bench plot: {path} is not a result of `omni bench serve --json` ({reason})", err=True)
        sys.exit(2)
    return result


def _labels(paths: tuple[str, ...]) -> list[str]:
    """Each run is named by its file name without .json; by its path where two names are alike."""
    stems = [os.path.splitext(os.path.basename(path))[0] for path in paths]
    return [stem if stems.count(stem) == 1 else path for stem, path in zip(stems, paths, strict=True)]
