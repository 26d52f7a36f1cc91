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
def serve(json_out: str | None, **options) -> None:
    """Load-test a speech, transcription or chat endpoint of any OpenAI-compatible server."""
    from omni_core.bench.report import RichReporter, results_table
    from omni_core.bench.runner import BenchConfig, BenchError, run_benchmark

    base_url = options.pop("base_url").rstrip("/")
    if base_url.endswith("/v1"):
        base_url = base_url[: -len("/v1")]
    # With the JSON on stdout, the table and progress go to stderr so the JSON stays parseable.
    console = Console(stderr=json_out == "-")
    config = BenchConfig(base_url=base_url, concurrencies=options.pop("concurrency"), **options)
    if json_out and json_out != "-":  # found now, not after the whole run
        folder = os.path.dirname(os.path.abspath(json_out))
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
            click.echo(f"omni bench: --json {json_out}: cannot write into {folder}", err=True)
            sys.exit(2)
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
