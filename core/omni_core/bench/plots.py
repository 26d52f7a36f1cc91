"""Figures of bench results, one PNG per metric: concurrency levels along x, one colour per run
and one line style per percentile, so that several runs compare on the same axes.

matplotlib is optional (omni-core's ``plot`` extra); only ``--plot`` and ``omni bench plot``
import it.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from omni_core.bench.report import speaks

PERCENTILE_STYLES = {"mean": "-.", "p50": "-", "p95": "--", "p99": ":"}
Run = tuple[str, dict]  # (label shown in legends, a result as `omni bench serve --json` writes it)


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise PlotUnavailable("plots need matplotlib: pip install matplotlib "
                              "(or omni-core's extra: pip install './core[plot]')") from None


@dataclass
class Plot:
    title: str
    png: bytes


def plots(runs: Sequence[Run]) -> list[Plot]:
    """The figures these runs call for: first output and latency always; throughput; real-time
    factor where audio was measured; underrun where audio was streamed."""
    require_matplotlib()
    axis = _LevelAxis(runs)
    many = len(runs) > 1
    first = "first audio" if all(speaks(result) for _, result in runs) else "first output"
    figures = [
        Plot(f"time to {first} (ms)", _percentile_figure(
            runs, axis, many, f"time to {first} (ms)", lambda lv: lv["time_to_first_output_ms"], ("p50", "p95", "p99"))),
        Plot("latency (ms)", _percentile_figure(
            runs, axis, many, "latency (ms)", lambda lv: lv["latency_ms"], ("p50", "p95", "p99"))),
    ]
    with_audio = [run for run in runs if _has_audio(run[1])]
    figures.append(Plot("throughput", _throughput_figure(runs, axis, many, bool(with_audio))))
    if with_audio:
        figures.append(Plot("real-time factor", _percentile_figure(
            with_audio, axis, many, "real-time factor (latency / audio s)", lambda lv: lv["rtf"],
            ("mean", "p50", "p95", "p99"), real_time_line=True)))
    streamed = [run for run in with_audio if run[1]["config"]["stream"] and speaks(run[1])]
    if streamed:
        figures.append(Plot("playback underrun", _underrun_figure(streamed, axis, many)))
    return figures


class _LevelAxis:
    """Concurrency levels as evenly spaced categories (1, 8, 32 would crowd a linear axis)."""

    def __init__(self, runs: Sequence[Run]):
        self.levels = sorted({level["concurrency"] for _, result in runs for level in result["levels"]})

    def x(self, level: dict) -> int:
        return self.levels.index(level["concurrency"])

    def apply(self, ax) -> None:
        ax.set_xticks(range(len(self.levels)), [str(c) for c in self.levels])
        ax.set_xlabel("concurrency")
        ax.set_xlim(-0.3, len(self.levels) - 0.7)
        ax.grid(True, alpha=0.3)


def _has_audio(result: dict) -> bool:
    return any(lv["output_audio_seconds"] or lv["input_audio_seconds"] for lv in result["levels"])


def _value(number: float | None) -> float:
    return math.nan if number is None else float(number)  # NaN leaves a gap: the level had no success


def _series(ax, axis: _LevelAxis, result: dict, pick: Callable[[dict], float | None], **style) -> None:
    levels = sorted(result["levels"], key=lambda lv: lv["concurrency"])
    ax.plot([axis.x(lv) for lv in levels], [_value(pick(lv)) for lv in levels], marker="o", **style)


def _name(label: str, what: str, many: bool) -> str:
    return f"{label} · {what}" if many else what


def _percentile_figure(runs, axis, many, ylabel, pick, keys, real_time_line=False) -> bytes:
    figure, (ax,) = _figure(1)
    for index, (label, result) in enumerate(runs):
        for key in keys:
            _series(ax, axis, result, lambda lv, key=key: pick(lv).get(key), color=f"C{index % 10}",
                    linestyle=PERCENTILE_STYLES[key], label=_name(label, key, many))
    if real_time_line:
        ax.axhline(1.0, color="grey", linewidth=0.8)  # above it, audio comes slower than it plays
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    axis.apply(ax)
    ax.legend(fontsize="small")
    return _png(figure)


def _throughput_figure(runs, axis, many, with_audio: bool) -> bytes:
    figure, axes = _figure(2 if with_audio else 1)
    panels = [("requests / s", lambda lv: lv["request_throughput"])]
    if with_audio:
        panels.append(("audio seconds / wall second", lambda lv: lv["audio_seconds_per_second"]))
    for ax, (ylabel, pick) in zip(axes, panels, strict=True):
        for index, (label, result) in enumerate(runs):
            _series(ax, axis, result, pick, color=f"C{index % 10}", label=label)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        axis.apply(ax)
        if many:
            ax.legend(fontsize="small")
    return _png(figure)


def _underrun_figure(runs, axis, many) -> bytes:
    figure, (total_ax, count_ax) = _figure(2)
    for index, (label, result) in enumerate(runs):
        color = f"C{index % 10}"
        _series(total_ax, axis, result, lambda lv: lv["underrun_s"].get("total"), color=color, label=label)
        _series(count_ax, axis, result, lambda lv: lv["requests_with_underrun"] / max(lv["completed"], 1) * 100,
                color=color, label=label)
    total_ax.set_ylabel("stalled seconds, all requests")
    count_ax.set_ylabel("requests that stalled (%)")
    for ax in (total_ax, count_ax):
        ax.set_ylim(bottom=0)
        axis.apply(ax)
        if many:
            ax.legend(fontsize="small")
    return _png(figure)


def _figure(panels: int):
    from matplotlib.figure import Figure  # no pyplot: no global figure state, no GUI backend

    figure = Figure(figsize=(6.4 * panels, 3.8), dpi=100, layout="constrained")
    axes = figure.subplots(1, panels, squeeze=False)[0]
    return figure, list(axes)


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
