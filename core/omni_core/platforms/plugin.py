"""The core's platforms, registered through the same hook as any plugin's."""

from __future__ import annotations

from omni_core.hooks import hookimpl
from omni_core.platforms.cpu import CpuPlatform
from omni_core.platforms.cuda import CudaPlatform


@hookimpl
def omni_platforms():
    return [CpuPlatform(), CudaPlatform()]
