"""Hardware platforms: the interface and how ``--device`` picks one."""

from omni_core.platforms.base import MemoryInfo, Platform
from omni_core.platforms.select import resolve_platform

__all__ = ["MemoryInfo", "Platform", "resolve_platform"]
