"""The hardware platform interface. Built-ins: ``cpu`` and ``cuda``; plugins add more."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class MemoryInfo:
    total_bytes: int
    free_bytes: int


class Platform:
    """A hardware backend. Subclasses override what differs from the defaults below."""

    name: str = "base"
    device_type: str = "cpu"  # torch device type
    dist_backend: str = "gloo"  # torch.distributed backend
    supports_graphs: bool = False  # can capture decode steps in a graph (CUDA graphs)
    priority: int = 0  # `--device auto` picks the available platform with the highest priority

    def is_available(self) -> tuple[bool, str]:
        """``(True, "")`` when usable here, else ``(False, reason)``."""
        return True, ""

    def device(self, index: int = 0) -> str:
        return self.device_type if self.device_type == "cpu" else f"{self.device_type}:{index}"

    def device_count(self) -> int:
        return 1

    def memory_info(self, index: int = 0) -> MemoryInfo:
        raise NotImplementedError

    def synchronize(self) -> None:
        """Wait for queued device work (timing)."""

    def describe(self) -> dict:
        ok, reason = self.is_available()
        return {"name": self.name, "available": ok, "reason": reason or None, "device_type": self.device_type}
