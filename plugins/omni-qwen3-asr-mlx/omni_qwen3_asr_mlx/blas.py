"""Use the system OpenBLAS for MLX's CPU matrix products on Linux.

The ``mlx[cpu]`` wheels for Linux bundle the unoptimised reference BLAS, which makes every
matmul and convolution of the model 10-15x slower than OpenBLAS on the same cores (see
docs/benchmarks.md). Loading OpenBLAS into the global symbol scope before
``mlx.core`` is first imported makes MLX bind to it. Nothing changes on macOS (Accelerate) or
when OpenBLAS is absent (``apt install libopenblas0``); ``OMNI_MLX_BLAS=bundled`` opts out.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

_loaded: str | None = None


def prefer_openblas() -> str | None:
    """Load OpenBLAS globally if it can still take effect; returns its path or None."""
    global _loaded
    if _loaded or sys.platform != "linux" or os.environ.get("OMNI_MLX_BLAS") == "bundled":
        return _loaded
    if "mlx.core" in sys.modules:  # MLX already bound its BLAS symbols
        return None
    name = ctypes.util.find_library("openblas")
    if name is None:
        return None
    try:
        ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        return None
    _loaded = name
    return name


def active_blas() -> str:
    return f"openblas ({_loaded})" if _loaded else "bundled"
