"""One self-contained HTML page of bench results: the plots as inline PNGs (no scripts, no files
beside it, nothing fetched), then each run's settings and its numbers table."""

from __future__ import annotations

import base64
import os
from collections.abc import Sequence
from html import escape

from omni_core.bench.plots import Run, plots
from omni_core.bench.report import level_label, run_title, table_rows

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem; color: #222; }
figure { display: inline-block; margin: 0 1rem 1.5rem 0; }
figure img { max-width: 100%; border: 1px solid #ddd; }
figcaption { font-weight: 600; }
table { border-collapse: collapse; margin-bottom: 1.5rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; }
td.number { text-align: right; font-variant-numeric: tabular-nums; }
dl { display: grid; grid-template-columns: max-content auto; gap: 0.1rem 1rem; }
dt { color: #666; }
"""

# The settings worth seeing next to the numbers, in this order.
_SETTINGS = ("endpoint", "stream", "stream_format", "num_requests", "request_rate", "seed", "dataset",
             "chat_audio", "extra_body")


def render(runs: Sequence[Run]) -> str:
    """The page for these runs, in the order given (the first is the baseline a reader expects)."""
    figures = "\n".join(
        f'<figure><figcaption>{escape(plot.title)}</figcaption>'
        f'<img alt="{escape(plot.title)}" src="data:image/png;base64,{base64.b64encode(plot.png).decode()}">'
        f"</figure>"
        for plot in plots(runs)
    )
    sections = "\n".join(_run_section(label, result) for label, result in runs)
    names = ", ".join(escape(label) for label, _ in runs)
    return (
        f'<!doctype html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>omni bench: {names}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n"
        f"<h1>omni bench: {names}</h1>\n<section>\n{figures}\n</section>\n{sections}\n</body>\n</html>\n"
    )


def write(path: str, runs: Sequence[Run]) -> None:
    """Renders first, then replaces ``path`` at once: a failed render leaves no half page."""
    page = render(runs)
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(page)
    os.replace(tmp, path)


def _run_section(label: str, result: dict) -> str:
    config = result["config"]
    settings = {"server": config["base_url"], "model": result["model"], "voice": result.get("voice"),
                **{key: config.get(key) for key in _SETTINGS},
                "sample rate": result.get("sample_rate"), "warm-up requests": result.get("warmup_requests")}
    listed = "".join(f"<dt>{escape(key)}</dt><dd>{escape(str(value))}</dd>"
                     for key, value in settings.items() if value not in (None, {}, False) or key == "stream")
    head = "".join(f"<th>{escape(level_label(level))}</th>" for level in result["levels"])
    body = "".join(
        f"<tr><th scope=\"row\">{escape(metric)}</th>"
        + "".join(f'<td class="number">{escape(cell)}</td>' for cell in cells) + "</tr>"
        for metric, cells in table_rows(result)
    )
    return (f"<section>\n<h2>{escape(label)}</h2>\n<p>{escape(run_title(result))}</p>\n<dl>{listed}</dl>\n"
            f"<table>\n<thead><tr><th>metric</th>{head}</tr></thead>\n<tbody>{body}</tbody>\n</table>\n</section>")
