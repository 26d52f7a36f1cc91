"""docs/plugins.md documents every hookspec with its exact signature."""

from __future__ import annotations

import inspect
from pathlib import Path

from omni_core.hooks import hookspecs

DOC = Path(__file__).resolve().parents[3] / "docs" / "plugins.md"


def specs():
    return {name: fn for name, fn in vars(hookspecs).items() if callable(fn) and hasattr(fn, "omni_spec")}


def test_there_are_hookspecs():
    assert set(specs()) >= {"omni_families", "omni_engines", "omni_platforms", "omni_transports", "omni_stage_hooks"}


def test_every_hookspec_has_a_docstring():
    for name, fn in specs().items():
        assert (fn.__doc__ or "").strip(), f"{name} has no docstring"


def test_every_hookspec_is_documented_with_its_signature():
    text = DOC.read_text()
    for name, fn in specs().items():
        params = ", ".join(inspect.signature(fn).parameters)
        heading = f"### `{name}({params})`"
        assert heading in text, f"docs/plugins.md lacks the heading {heading}"
