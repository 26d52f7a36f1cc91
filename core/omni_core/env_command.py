"""``omni env``: the environment as a bug report wants it, as text or JSON."""

from __future__ import annotations

import json

import click

from omni_core.env_report import environment_report
from omni_core.hooks import get_plugin_manager


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _device_line(device: dict) -> str:
    name = f"  {device['name']}" if device["name"] != device["device"] else ""
    memory = f"  {_gib(device['free_bytes'])} free of {_gib(device['total_bytes'])}" if "total_bytes" in device else ""
    return f"      {device['device']}{name}{memory}"


def format_report(report: dict) -> str:
    build = report["torch_build"]
    lines = [f"{'omni-core':<14}{report['omni_core']}", f"{'python':<14}{report['python']} ({report['os']})"]
    for name, version in report["packages"].items():
        lines.append(f"{name:<14}{version or 'not installed'}")
        if name == "torch" and "error" not in build:
            lines[-1] += f" (CUDA {build['cuda'] or 'none'}, XPU {build['xpu'] or 'none'})"
    cpu = report["cpu"]
    threads = f", torch threads {build['threads']}" if "threads" in build else ""
    lines.append(f"{'cpu':<14}{cpu['machine']}: {cpu['usable_cores']} of {cpu['cores']} cores usable{threads}")

    lines += ["", "plugins"]
    width = max((len(p["name"]) for p in report["plugins"]), default=0)
    dists = [f"{p['dist']} {p['version']}" for p in report["plugins"]]
    dist_width = max(map(len, dists), default=0)
    for plugin, dist in zip(report["plugins"], dists, strict=True):
        status = plugin["status"] if plugin["status"] == "ok" else f"error: {plugin['error']}"
        lines.append(f"  {plugin['name']:<{width}}  {dist:<{dist_width}}  {status}")

    lines += ["", f"platforms (--device auto picks {report['auto_device'] or 'none'})"]
    width = max((len(p["name"]) for p in report["platforms"]), default=0)
    for p in report["platforms"]:
        if not p["available"]:
            lines.append(f"  {p['name']:<{width}}  unavailable: {p['reason']}")
            continue
        graphs = "graphs" if p["supports_graphs"] else "eager"
        lines.append(f"  {p['name']:<{width}}  available: {p['dist_backend']}, {graphs}, {p['attention_backend']} attention, "
                     f"{p['default_dtype']} by default of {', '.join(p['dtypes'])}")
        lines += [_device_line(device) for device in p["devices"]]
        if "error" in p:
            lines.append(f"      devices: {p['error']}")

    if report["environment"]:
        lines += ["", "environment"] + [f"  {k}={v}" for k, v in report["environment"].items()]
    return "\n".join(lines)


@click.command("env")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def env(as_json: bool) -> None:
    """Versions, plugins, platforms and devices: paste it into a bug report."""
    report = environment_report(get_plugin_manager())
    click.echo(json.dumps(report, indent=2) if as_json else format_report(report))
