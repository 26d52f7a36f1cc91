"""Loading a sharded checkpoint says how far it has got: a line a file in a log, a bar on a
terminal (omni_core.progress)."""

from __future__ import annotations

import fcntl
import logging
import os
import pty
import select
import struct
import subprocess
import sys
import termios

import torch
from omni_core.models import iter_safetensors
from safetensors.torch import save_file


def _shards(directory, count: int) -> None:
    for i in range(count):
        save_file({f"layer{i}.weight": torch.full((4,), float(i))}, str(directory / f"model-{i + 1:05d}-of-{count:05d}.safetensors"))


def test_a_log_gets_a_line_a_file(tmp_path, caplog):
    _shards(tmp_path, 3)
    caplog.set_level(logging.INFO, logger="omni.progress")
    names = [name for name, _ in iter_safetensors(tmp_path)]
    assert names == ["layer0.weight", "layer1.weight", "layer2.weight"]
    lines = [r.getMessage() for r in caplog.records if r.name == "omni.progress"]
    assert lines == [f"loading {tmp_path.name} weights (files): {k} of 3" for k in (1, 2, 3)]


def test_a_terminal_gets_a_bar(tmp_path):
    _shards(tmp_path, 3)
    script = f"from omni_core.models import iter_safetensors; print(len(list(iter_safetensors({str(tmp_path)!r}))))"
    controller, terminal = pty.openpty()  # stderr is a terminal, as in an interactive `omni serve`
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # of a real size
    child = subprocess.Popen([sys.executable, "-c", script], stderr=terminal, stdout=subprocess.PIPE)
    drawn = b""
    while child.poll() is None or select.select([controller], [], [], 0.2)[0]:
        if select.select([controller], [], [], 0.2)[0]:
            drawn += os.read(controller, 65536)
    out = child.stdout.read()
    os.close(terminal)
    os.close(controller)
    assert child.returncode == 0 and out.strip() == b"3"
    assert b"weights (files)" in drawn and b"/3 [" in drawn and b"\r" in drawn  # tqdm redraws its line
