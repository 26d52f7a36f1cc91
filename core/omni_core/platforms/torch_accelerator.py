"""An accelerator whose torch module (``torch.cuda``, ``torch.xpu``: ``torch.<device_type>``)
has torch's common device interface: device count and names, free memory, synchronize,
streams and events. CUDA and XPU platforms differ in little else."""

from __future__ import annotations

from typing import Any

from omni_core.platforms.base import MemoryInfo, Platform


class TorchAcceleratorPlatform(Platform):
    accelerator = True
    default_dtype = "bfloat16"

    def _torch_module(self) -> Any:
        import torch

        return getattr(torch, self.device_type)

    def device_count(self) -> int:
        return self._torch_module().device_count()

    def device_name(self, index: int = 0) -> str:
        return self._torch_module().get_device_name(index)

    def memory_info(self, index: int | None = 0) -> MemoryInfo:
        free, total = self._torch_module().mem_get_info(index)
        return MemoryInfo(total_bytes=total, free_bytes=free)

    def synchronize(self, device: Any = None) -> None:
        self._torch_module().synchronize(device)

    def new_stream(self, device: Any, high_priority: bool = False) -> Any:
        # torch maps a priority past the device's range to its highest (lower numbers run first)
        return self._torch_module().Stream(device, priority=-100 if high_priority else 0)

    def default_stream(self, device: Any) -> Any:
        return self._torch_module().default_stream(device)

    def use_stream(self, stream: Any):
        return self._torch_module().stream(stream)

    def record_event(self) -> Any:
        event = self._torch_module().Event()
        event.record()
        return event
