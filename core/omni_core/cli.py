"""The ``omni`` command. Subcommands live with the layer they drive and load on first use, so
``omni plugins list`` does not import the HTTP server or torch models."""

from __future__ import annotations

import importlib

import click

from omni_core import __version__

# command name -> "module:attribute" of a click command
LAZY_COMMANDS = {
    "env": "omni_core.env_command:env",
    "families": "omni_core.family_commands:families",
    "plugins": "omni_core.plugin_commands:plugins",
    "serve": "omni_core.serve.command:serve",
    "bench": "omni_core.bench.command:bench",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(LAZY_COMMANDS))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module_name, attr = LAZY_COMMANDS[name].split(":")
            return getattr(importlib.import_module(module_name), attr)
        return super().get_command(ctx, name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="omni")
def main() -> None:
    """omni: serve multi-stage speech and omni models behind an OpenAI-compatible API."""


if __name__ == "__main__":
    main()
