"""Small C kernels for the host, compiled on first use with the machine's C compiler.

Each ``.c`` file here (with the headers beside it) is built once per source, compiler flags and
CPU into a shared library under ``$OMNI_CACHE/native`` (default ``~/.cache/omni/native``) and
loaded with ``ctypes``:
no build step at install, and the code is compiled for the CPU it runs on (``-march=native``).
Where no compiler works, or with ``OMNI_NATIVE=0``, ``load`` returns ``None`` and callers keep
their torch path. The flags allow the reassociation that vectorized sums need but not
``-ffast-math``, whose start-up code would flush denormals for the whole process.

The kernels run on the calling thread. Attention (decode and prefill) and the linear kernel are
taken with at most ``MAX_INTRA_OP_THREADS`` intra-op threads (``preferred``): with more, torch's
parallel loops win (docs/experiments/2026-12-03-cpu-engine-kernels.md: decode attention equal at 4 threads, grouped SDPA 1.1-1.2x
faster at 8-16 on a 16-core host). The element-wise kernels are also taken, at any thread count,
for tensors too small for torch to split across threads (``host_ops.PARALLEL_GRAIN``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from omni_core.cache import cache_root

log = logging.getLogger(__name__)

NATIVE_ENV = "OMNI_NATIVE"
MAX_INTRA_OP_THREADS = 2
FLAGS = ["-O3", "-march=native", "-fno-math-errno", "-fassociative-math", "-fno-signed-zeros", "-fno-trapping-math", "-ffp-contract=fast", "-fPIC", "-shared"]


KERNELS = ("paged_decode", "paged_prefill", "host_ops", "linear", "moe")


def build_all() -> None:
    """Build (or find) every library now, so that a first request does not wait for the compiler."""
    for name in KERNELS:
        load(name)


def enabled() -> bool:
    return os.environ.get(NATIVE_ENV, "1") != "0"


def preferred(name: str) -> bool:
    """``<name>.c`` builds here, and few enough intra-op threads that one thread on it beats them."""
    return torch.get_num_threads() <= MAX_INTRA_OP_THREADS and load(name) is not None


def load(name: str) -> ctypes.CDLL | None:
    """The library built from ``<name>.c`` beside this file, or None where it cannot be built."""
    return load_source(Path(__file__).with_name(f"{name}.c"))


@functools.cache
def load_source(source: Path) -> ctypes.CDLL | None:
    """The library built from the C file ``source`` (a plugin may ship its own; the headers beside
    it are part of its build key), or None where it cannot be built."""
    name = source.stem
    if not enabled():
        return None
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("no C compiler found: the host kernels of %s fall back to torch", name)
        return None
    code = b"".join(path.read_bytes() for path in [source, *sorted(source.parent.glob("*.h"))])  # with the headers it includes
    key = hashlib.sha256(b"\0".join([code, " ".join(FLAGS).encode(), compiler.encode(), _cpu_identity()])).hexdigest()[:16]
    cache = cache_root() / "native"
    target = cache / f"{name}-{key}.so"
    if not target.exists():
        try:
            cache.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                built = Path(tmp) / target.name
                subprocess.run([compiler, *FLAGS, "-o", str(built), str(source)], check=True, capture_output=True, timeout=120)
                os.replace(built, target)  # atomic: a process building the same library at once loses nothing
        except (OSError, subprocess.SubprocessError) as err:
            detail = err.stderr.decode(errors="replace").strip() if isinstance(err, subprocess.CalledProcessError) else str(err)
            log.warning("building %s failed, its host kernels fall back to torch: %s", name, detail)
            return None
    try:
        return ctypes.CDLL(str(target))
    except OSError as err:
        log.warning("loading %s failed, its host kernels fall back to torch: %s", target, err)
        return None


def function(name: str | Path, symbol: str, argtypes: list, restype=None):
    """``symbol`` of the library built from ``<name>.c`` (or from the C file at a path) with its
    ctypes signature, or None where the library cannot be built."""
    lib = load_source(name) if isinstance(name, Path) else load(name)
    if lib is None:
        return None
    fn = getattr(lib, symbol)
    fn.argtypes, fn.restype = argtypes, restype
    return fn


def _cpu_identity() -> bytes:
    """What ``-march=native`` compiles for: the machine and, on Linux, the CPU's feature flags."""
    identity = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            identity += next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        identity += platform.processor()
    return identity.encode()
