"""``omni families [NAME]``: the installed model families, or what one offers: its tasks, presets,
default checkpoint and the build options ``omni serve --option`` takes, with their meanings."""

from __future__ import annotations

import json
import sys

import click

from omni_core.hooks import UnknownNameError, get_plugin_manager


def _describe(spec) -> dict:
    return {
        "name": spec.name,
        "description": spec.description,
        "tasks": list(spec.tasks),
        "presets": sorted(spec.presets),
        "default_checkpoint": spec.default_checkpoint,
        "sample_rate": spec.sample_rate,
        "input_sample_rate": spec.input_sample_rate,
        "options": spec.options,
    }


@click.command("families")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
def families(name: str | None, as_json: bool) -> None:
    """List the installed model families, or one family's tasks, presets and build options."""
    manager = get_plugin_manager()
    if name is None:
        found = [_describe(spec) for _, spec in sorted(manager.families().items())]
        if as_json:
            click.echo(json.dumps(found, indent=2))
            return
        for family in found:
            click.echo(f"{family['name']:<16} {', '.join(family['tasks']):<32} presets: {', '.join(family['presets']) or '-'}")
        if not found:
            click.echo("no model family is installed (each comes in a plugin package: pip install ./plugins/omni-NAME)")
        return
    try:
        family = _describe(manager.family(name))
    except UnknownNameError as exc:
        click.echo(f"omni families: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(family, indent=2))
        return
    click.echo(f"{family['name']}: {family['description']}")
    click.echo(f"tasks: {', '.join(family['tasks'])}")
    click.echo(f"presets: {', '.join(family['presets']) or '-'}; default checkpoint: {family['default_checkpoint'] or '-'}")
    if family["options"] is None:
        click.echo("options: not declared by the family (every --option is passed to its build)")
        return
    click.echo("options (omni serve --option KEY=VALUE):" if family["options"] else "options: none")
    width = max((len(key) for key in family["options"]), default=0)
    for key, meaning in sorted(family["options"].items()):
        click.echo(f"  {key:<{width}}  {meaning}")
