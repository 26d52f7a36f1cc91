"""Writes a new plugin package: the path a third party follows to publish a family or a platform.

The package works as written: ``pip install ./omni-NAME`` then ``omni plugins list`` shows it
with status ok, and its test passes. A family starts as a tone synthesiser (a real stage on the
core runtime) that the author replaces with their model.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

from omni_core import __version__


class ScaffoldError(ValueError):
    pass


_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")

_PYPROJECT = """\
[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "omni-$name"
version = "0.1.0"
description = "$description"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["omni-core>=$core_version"]

[project.entry-points.omni]
$name = "$module.plugin"

[tool.setuptools.packages.find]
include = ["$module*"]
"""

_README = """\
# omni-$name

$description

```bash
pip install .
omni plugins list          # shows "$name" with status ok
pytest tests               # the plugin's own test
```

The plugin contract (every hook and its signature) is documented in omni's docs/plugins.md.
"""

_FAMILY_PLUGIN = '''\
"""omni family `$name`: replace the tone stage with your model's stages."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from omni_core.hooks import FamilySpec, Voice, hookimpl
from omni_core.pipeline import StageSpec, Topology

SAMPLE_RATE = 24000


def write_tiny(directory: str) -> str:
    """The `tiny` preset: a checkpoint directory with deterministic settings."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"base_hz": 220.0, "seconds_per_char": 0.02}))
    return str(path)


def tone_stage(context):
    """Stage factory: runs where the stage lives and returns the worker for the `fn` engine."""
    config = json.loads((Path(context.options["checkpoint"]) / "config.json").read_text())

    def synthesize(message, emit):
        text = message.payload["text"]
        for index, char in enumerate(text.split()):
            samples = max(1, int(SAMPLE_RATE * config["seconds_per_char"] * len(char)))
            t = torch.arange(samples) / SAMPLE_RATE
            pitch = config["base_hz"] * (1 + (ord(char[0]) % 12) / 12)
            emit("audio", {"audio": 0.2 * torch.sin(2 * math.pi * pitch * t)}, end=False)
        emit("audio", {}, end=True)

    return synthesize


def build(checkpoint_dir: str, options: dict) -> Topology:
    stage = StageSpec("tone", engine="fn", factory=tone_stage, inputs=("in",), outputs=("audio",),
                      options={"checkpoint": checkpoint_dir})
    return Topology(stages=[stage], edges=[], entry="tone.in", outputs={"audio": "tone.audio"}, name="$name")


@hookimpl
def omni_families():
    return [
        FamilySpec(
            name="$name",
            tasks=("speech",),
            build=build,
            presets={"tiny": write_tiny},
            sample_rate=SAMPLE_RATE,
            voices=lambda checkpoint_dir: [Voice("default", "default")],
            description="$description",
            options={},  # the --option keys build reads, each with its default and meaning; others are refused
        )
    ]
'''

_FAMILY_TEST = '''\
"""The family through omni-core's testing kit (its pytest fixtures: omni_plugin, omni_pipeline,
omni_server)."""

import torch


def test_family_is_discovered_and_speaks(omni_plugin, omni_pipeline):
    omni_plugin("$name")
    pipeline = omni_pipeline("$name")
    events = list(pipeline.submit({"task": "speech", "text": "hello plugin world"}))
    chunks = [e.payload["audio"] for e in events if "audio" in e.payload]
    assert len(chunks) == 3
    assert events[-1].end
    audio = torch.cat(chunks)
    assert audio.abs().max() > 0.1


def test_family_serves_the_openai_client(omni_server):
    server = omni_server("$name")
    reply = server.openai().audio.speech.create(model="$name", voice="default", input="hello plugin world", response_format="wav")
    assert reply.content[:4] == b"RIFF" and len(reply.content) > 1000
'''

_PLATFORM_PLUGIN = '''\
"""omni platform `$name`: fill in how your hardware is found and used."""

from __future__ import annotations

import os

from omni_core.hooks import hookimpl
from omni_core.platforms import MemoryInfo, Platform


class ${class_name}Platform(Platform):
    name = "$name"
    device_type = "cpu"  # the torch device type your backend uses
    dist_backend = "gloo"
    supports_graphs = False
    priority = 1

    def is_available(self):
        if os.environ.get("${env_prefix}_DISABLE"):
            return False, "disabled by ${env_prefix}_DISABLE"
        return True, ""

    def memory_info(self, index: int = 0) -> MemoryInfo:
        page = os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES"))


@hookimpl
def omni_platforms():
    return [${class_name}Platform()]
'''

_PLATFORM_TEST = '''\
from omni_core.hooks import PluginManager


def test_platform_is_discovered_and_available():
    manager = PluginManager()
    record = next(r for r in manager.records if r.name == "$name")
    assert record.status == "ok", record.error
    platform = manager.platform("$name")
    assert platform.is_available() == (True, "")
    assert platform.memory_info().total_bytes > 0
'''


def write_plugin(name: str, kind: str, directory: Path) -> Path:
    """Create ``directory/omni-<name>`` and return its path."""
    if not _NAME.match(name) or len(name) > 64:
        raise ScaffoldError(f"plugin name {name!r} must be 1-64 lowercase letters, digits and dashes, e.g. acme-tts")
    if kind not in ("family", "platform"):
        raise ScaffoldError(f"unknown kind {kind!r}: family or platform")
    module = "omni_" + name.replace("-", "_")
    target = Path(directory) / f"omni-{name}"
    if target.exists():
        raise ScaffoldError(f"{target} already exists")
    description = f"omni {kind} plugin {name}"
    values = {
        "name": name,
        "module": module,
        "description": description,
        "core_version": __version__,
        "class_name": "".join(part.capitalize() for part in name.split("-")),
        "env_prefix": name.upper().replace("-", "_"),
    }
    plugin, test = (_FAMILY_PLUGIN, _FAMILY_TEST) if kind == "family" else (_PLATFORM_PLUGIN, _PLATFORM_TEST)
    files = {
        "pyproject.toml": _PYPROJECT,
        "README.md": _README,
        f"{module}/__init__.py": f'"""{description}."""\n',
        f"{module}/plugin.py": plugin,
        f"tests/test_{module}.py": test,
    }
    for relative, template in files.items():
        path = target / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(template).substitute(values))
    return target
