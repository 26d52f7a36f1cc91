from __future__ import annotations

from omni_core.platforms.base import MemoryInfo, Platform


class CudaPlatform(Platform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    supports_graphs = True
    priority = 10

    def is_available(self) -> tuple[bool, str]:
        import torch

        if not torch.cuda.is_available():
            built = torch.version.cuda
            return False, "no CUDA device visible" if built else "this torch build has no CUDA support"
        return True, ""

    def device_count(self) -> int:
        import torch

        return torch.cuda.device_count()

    def memory_info(self, index: int = 0) -> MemoryInfo:
        import torch

        free, total = torch.cuda.mem_get_info(index)
        return MemoryInfo(total_bytes=total, free_bytes=free)

    def synchronize(self) -> None:
        import torch

        torch.cuda.synchronize()
