from __future__ import annotations

import os

from omni_core.platforms.base import MemoryInfo, Platform


class CpuPlatform(Platform):
    name = "cpu"
    device_type = "cpu"
    dist_backend = "gloo"
    priority = 0

    def memory_info(self, index: int = 0) -> MemoryInfo:
        page = os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(total_bytes=page * os.sysconf("SC_PHYS_PAGES"), free_bytes=page * os.sysconf("SC_AVPHYS_PAGES"))
