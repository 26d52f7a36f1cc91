"""omni's own cache directory (presets, saved voices, built host kernels)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$OMNI_CACHE`` or ``~/.cache/omni``."""
    return Path(os.environ.get("OMNI_CACHE", Path.home() / ".cache" / "omni"))
