from __future__ import annotations

import os
import platform
from pathlib import Path

from omni_core.platforms.base import MemoryInfo, Platform


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0

    def device_name(self, index: int = 0) -> str:
        try:  # Linux names the model here; platform.processor() is often empty there
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or platform.machine()

    def memory_info(self, index: int = 0) -> MemoryInfo:
        page = os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(total_bytes=page * os.sysconf("SC_PHYS_PAGES"), free_bytes=page * os.sysconf("SC_AVPHYS_PAGES"))
