"""Hardware platforms: the interface, how ``--device`` picks one, and which one owns a device."""

from omni_core.platforms.base import MemoryInfo, Platform
from omni_core.platforms.select import PlatformUnavailableError, platform_for, resolve_platform
from omni_core.platforms.torch_accelerator import TorchAcceleratorPlatform

__all__ = [
    "MemoryInfo",
    "Platform",
    "PlatformUnavailableError",
    "TorchAcceleratorPlatform",
    "platform_for",
    "resolve_platform",
]
