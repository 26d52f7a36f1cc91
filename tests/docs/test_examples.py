"""Every ```python and ```bash example of README.md and docs/api.md, run as written against real
servers of the families scripts/setup.sh installs.

The examples are read from the Markdown when the tests are collected, so an edited or added one
is covered. The servers are the ones the docs' ``omni serve`` lines name, each started once for
the module on a free port of 127.0.0.1; an example's ``127.0.0.1:PORT`` (or ``localhost:PORT``)
is rewritten to the port of the server its document names on that port.

- Python blocks run with ``exec`` in a working directory that holds the files the examples open
  (speech spoken by espeak-ng, a picture). A block that uses ``client`` without making one gets
  the ``openai`` client of the server its ``model=`` names. The placeholders an example leaves to
  the reader are given: ``play`` (an audio sink: it keeps the bytes), ``microphone_pcm16_chunks``
  (the spoken clip, then a second of silence, in 100 ms pieces) and ``samples`` (the clip as
  16 kHz float32).
- Bash blocks run their commands one by one: ``curl`` (with ``-sS --fail-with-body``, so an error
  status fails) and ``omni`` commands that finish. A block of ``omni serve`` lines is what the
  module's servers are: it passes when each of them is ready and serves its family. A placeholder
  voice id (``voice_`` and 16 hex digits) that no earlier command printed is the id the block's
  last printed one.
- A block right after ``<!-- example: not run (REASON) -->`` is skipped with that reason; any other
  command fails the test: mark the block, or make it run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from tests.helpers.server import OmniServer

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", "docs/api.md")
MARKER = re.compile(r"<!--\s*example:\s*not run\s*\((?P<reason>.+)\)\s*-->")
FENCE = re.compile(r"^```(?P<lang>\w*)\s*$")
ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):(?P<port>\d+)\b")
CURL = re.compile(r"(?:^|(?<=\|))\s*curl\b")
VOICE_ID = re.compile(r"\bvoice_[0-9a-f]{16}\b")
# The realtime example reads events until the server closes the socket, which it does to a socket
# idle this long (60 s by default).
IDLE = ("--socket-idle-timeout", "2")
# What the examples' speech says (espeak-ng speaks it; whisper's real tiny.en transcribes it).
SENTENCE = "The weather today is sunny and warm."
QUESTION = "What colour is the cat in the picture?"


@dataclass(frozen=True)
class Example:
    doc: str
    line: int  # of the opening fence
    lang: str
    code: str
    not_run: str | None  # the marker's reason

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def examples() -> list[Example]:
    found = []
    for doc in DOCS:
        lines = (ROOT / doc).read_text().splitlines()
        index = 0
        while index < len(lines):
            fence = FENCE.match(lines[index])
            if not fence:
                index += 1
                continue
            end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
            if fence["lang"] in ("python", "bash"):
                before = next((lines[i] for i in range(index - 1, -1, -1) if lines[i].strip()), "")
                marker = MARKER.search(before)
                code = "\n".join(lines[index + 1 : end]) + "\n"
                found.append(
                    Example(doc, index + 1, fence["lang"], code, marker["reason"] if marker else None)
                )
            index = end + 1
    return found


def commands(code: str) -> list[str]:
    """A bash block's commands: lines joined at their trailing backslashes, comments and blank
    lines left out."""
    joined = re.sub(r"\\\n\s*", " ", code)
    return [line for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def served(code: str) -> list[tuple[int, tuple[str, ...]]]:
    """The ``omni serve`` commands of a block: (port, the serve arguments but host and port)."""
    found = []
    for command in commands(code):
        for part in command.split("&&"):
            words = shlex.split(part, comments=True)
            if words[:2] != ["omni", "serve"]:
                continue
            args, port, rest = [], 8000, iter(words[2:])
            for word in rest:
                if word == "--port":
                    port = int(next(rest))
                elif word == "--host":
                    next(rest)
                else:
                    args.append(word)
            found.append((port, tuple(args)))
    return found


EXAMPLES = examples()


def option(args: tuple[str, ...], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


@dataclass
class Docs:
    """The docs' servers: for each document, its port -> server, and its family -> server."""

    ports: dict[str, dict[int, OmniServer]]
    families: dict[str, dict[str, OmniServer]]

    def rewrite(self, doc: str, code: str) -> str:
        def port(match: re.Match) -> str:
            server = self.ports[doc].get(int(match["port"]))
            assert server is not None, f"{doc} names {match[0]}, where it serves nothing"
            return f"127.0.0.1:{server.port}"

        return ADDRESS.sub(port, code)


@pytest.fixture(scope="module")
def docs(tmp_path_factory) -> Docs:
    started: dict[tuple[str, ...], OmniServer] = {}
    ports: dict[str, dict[int, OmniServer]] = {doc: {} for doc in DOCS}
    families: dict[str, dict[str, OmniServer]] = {doc: {} for doc in DOCS}
    try:
        for example in EXAMPLES:
            for port, args in served(example.code):
                family = option(args, "--family")
                if args not in started:
                    rest = list(args)
                    del rest[args.index("--family") : args.index("--family") + 2]
                    workdir = tmp_path_factory.mktemp(f"server-{family}")
                    started[args] = OmniServer(
                        family, workdir, *rest, *IDLE, api_key=option(args, "--api-key")
                    )
                ports[example.doc][port] = families[example.doc][family] = started[args]
        for server in started.values():
            server.wait_ready(180)
        yield Docs(ports, families)
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """The files the examples open."""
    from omni_core.bench.dataset import spoken
    from PIL import Image

    folder = tmp_path_factory.mktemp("examples")
    speech, rate = sf.read(spoken(SENTENCE, folder / "spoken"), dtype="float32")
    sf.write(folder / "speech.flac", speech, rate)
    sf.write(folder / "ref.wav", speech, rate)
    question, question_rate = sf.read(spoken(QUESTION, folder / "spoken"), dtype="float32")
    sf.write(folder / "q.wav", question, question_rate)
    Image.new("RGB", (64, 48), (200, 120, 40)).save(folder / "cat.png")
    return folder


def speech_16k(folder: Path) -> np.ndarray:
    import soxr

    audio, rate = sf.read(folder / "speech.flac", dtype="float32")
    return soxr.resample(audio, rate, 16000).astype(np.float32)


def placeholders(folder: Path) -> dict:
    """What an example leaves to the reader: an audio sink, a microphone, samples."""
    played: list[bytes] = []

    def play(chunk: bytes, rate: int | None = None) -> None:
        played.append(bytes(chunk))

    def microphone_pcm16_chunks(rate: int = 16000):
        import soxr

        audio, source_rate = sf.read(folder / "speech.flac", dtype="float32")
        audio = np.concatenate([soxr.resample(audio, source_rate, rate), np.zeros(rate, np.float32)])
        pcm = (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()
        step = rate // 10 * 2
        for start in range(0, len(pcm), step):
            yield pcm[start : start + step]

    return {"play": play, "microphone_pcm16_chunks": microphone_pcm16_chunks, "samples": speech_16k(folder)}


def run_python(example: Example, docs: Docs, folder: Path) -> None:
    code = docs.rewrite(example.doc, example.code)
    namespace = {"__name__": "__example__", **placeholders(folder)}
    named = {m for m in re.findall(r"""\bmodel=["']([\w.-]+)["']""", code) if m in docs.families[example.doc]}
    if len(named) == 1:
        namespace["client"] = docs.families[example.doc][named.pop()].openai(timeout=120)
    exec(compile(code, example.id, "exec"), namespace)


def run_bash(example: Example, docs: Docs, folder: Path) -> None:
    lines = commands(example.code)
    assert lines, f"{example.id}: a bash block without a command"
    if all(served(line) for line in lines):  # the servers the fixture started
        for port, args in served(example.code):
            server = docs.ports[example.doc][port]
            assert server.process.poll() is None, server.log()
            ready = server.openai().with_options(timeout=30).models.list()
            assert [model.id for model in ready.data] == [
                option(args, "--served-model-name") or option(args, "--family")
            ]
        return
    printed = ""
    for line in lines:
        words = shlex.split(line, comments=True)
        if "curl" in words:  # at the start or after a pipe
            line = CURL.sub(r"\g<0> -sS --fail-with-body", line)
        elif words[0] == "omni" and words[1:2] != ["serve"]:
            line = f"{shlex.quote(sys.executable)} -m omni_core.cli " + line.split(None, 1)[1]
        else:
            pytest.fail(
                f"{example.id}: {line!r} is neither curl nor an omni command that finishes: mark the block"
            )
        line = docs.rewrite(example.doc, line)
        ids = VOICE_ID.findall(printed)
        if ids:
            line = VOICE_ID.sub(lambda m, ids=ids: m[0] if m[0] in ids else ids[-1], line)
        done = subprocess.run(
            ["bash", "-o", "pipefail", "-c", line], cwd=folder, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, (
            f"{example.id}: {line}\nexit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
        printed += done.stdout


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.id for e in EXAMPLES])
def test_example_runs(example: Example, request, monkeypatch) -> None:
    if example.not_run:
        pytest.skip(f"{example.id} not run: {example.not_run}")
    docs, workdir = request.getfixturevalue("docs"), request.getfixturevalue("workdir")
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("OMNI_CACHE", str(workdir / "cache"))
    if example.lang == "python":
        run_python(example, docs, workdir)
    else:
        run_bash(example, docs, workdir)


def test_the_examples_are_found() -> None:
    """The extraction sees every fence of both documents (a fence it missed would go untested),
    and every marker marks a block (one the block moved away from would mark nothing)."""
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        fences = len(re.findall(r"^```(?:python|bash)\s*$", text, flags=re.M))
        assert fences > 0, doc
        assert fences == sum(1 for e in EXAMPLES if e.doc == doc), doc
        markers = len(re.findall(r"^<!--\s*example:", text, flags=re.M))
        assert markers == sum(1 for e in EXAMPLES if e.doc == doc and e.not_run), (
            f"{doc}: a marker without its block"
        )
