"""``omni plugins list`` and ``omni plugins new``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from omni_core.hooks import get_plugin_manager


@click.group()
def plugins() -> None:
    """Inspect installed plugins and start new ones."""


@plugins.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array instead of a table.")
def list_plugins(as_json: bool) -> None:
    """List every plugin found through the `omni` entry-point group, broken ones included."""
    records = get_plugin_manager().records
    if as_json:
        click.echo(json.dumps([r.to_json() for r in records], indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title="omni plugins")
    for column in ("name", "dist", "version", "provides", "status"):
        table.add_column(column, overflow="fold")  # a long word wraps instead of losing its end
    for record in records:
        provides = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in record.provides().items() if names)
        status = "[green]ok[/green]" if record.status == "ok" else f"[red]error[/red]: {record.error}"
        table.add_row(record.name, record.dist, record.version, provides or "-", status)
    Console().print(table)


@plugins.command("new")
@click.argument("name")
@click.option("--kind", type=click.Choice(["family", "platform"]), default="family", show_default=True)
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Where to create the package folder.")
def new_plugin(name: str, kind: str, directory: Path) -> None:
    """Write a ready-to-install plugin package NAME (e.g. acme-tts) into DIR/omni-NAME."""
    from omni_core.scaffold import ScaffoldError, write_plugin

    try:
        target = write_plugin(name, kind, directory)
    except ScaffoldError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    click.echo(f"created {target}")
    # pip reads a bare name as a package on the index: a relative path needs its ./
    shown = target if target.is_absolute() else f"./{target}"
    click.echo(f"next: pip install {shown} && omni plugins list")
