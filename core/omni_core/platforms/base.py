"""The hardware platform interface. Built-ins: ``cpu`` and ``cuda``; plugins add more.

Core and families ask the platform of a device (``omni_core.platforms.platform_for``) what it
can do instead of testing device strings, so a backend that a plugin adds runs the same code.
The defaults describe a device that runs work in order on the host, as the CPU does.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any


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
    # a device with its own memory and a queue the host runs ahead of: copies go through pinned
    # host memory, decode steps overlap, the KV cache is sized from the device's free memory
    accelerator: bool = False
    attention_backend: str = "sdpa"  # the paged attention backend an engine picks by default
    dtypes: tuple[str, ...] = ("float32", "float64", "bfloat16", "float16")  # torch dtype names it computes in
    default_dtype: str = "float32"  # what a family's dtype "auto" means here
    ray_resource: str | None = None  # the Ray resource one device counts as (placement on Ray); None: CPU only

    def is_available(self) -> tuple[bool, str]:
        """``(True, "")`` when usable here, else ``(False, reason)``."""
        return True, ""

    def device(self, index: int = 0) -> str:
        return self.device_type if self.device_type == "cpu" else f"{self.device_type}:{index}"

    def device_count(self) -> int:
        return 1

    def device_name(self, index: int = 0) -> str:
        """The hardware's own name (a GPU's model), for ``omni env``."""
        return self.device(index)

    def memory_info(self, index: int | None = 0) -> MemoryInfo:
        """Total and free memory of device ``index`` (None: the current device)."""
        raise NotImplementedError

    def synchronize(self, device: Any = None) -> None:
        """Wait for the work queued on ``device`` (the current one when None)."""

    def new_stream(self, device: Any, high_priority: bool = False) -> Any:
        """A stream of its own on ``device`` for work to overlap other stages', or None where
        work runs in order. ``high_priority``: the device starts its waiting work ahead of other
        streams' (a stage whose steps bound the audio's latency)."""
        return None

    def default_stream(self, device: Any) -> Any:
        """The stream work on ``device`` goes to unless a stage chose its own (None: no streams)."""
        return None

    def use_stream(self, stream: Any):
        """A context manager that queues the block's work on ``stream`` (from ``new_stream``)."""
        return nullcontext()

    def record_event(self) -> Any:
        """An event recorded on the current stream, whose ``synchronize()`` waits for the work
        queued before it (releasing Python's GIL meanwhile), or None where work runs in order."""
        return None

    def describe(self) -> dict:
        """What ``omni env`` shows of this platform; a device query that fails is reported, not raised."""
        ok, reason = self.is_available()
        info = {
            "name": self.name,
            "available": ok,
            "reason": reason or None,
            "device_type": self.device_type,
            "dist_backend": self.dist_backend,
            "supports_graphs": self.supports_graphs,
            "attention_backend": self.attention_backend,
            "dtypes": list(self.dtypes),
            "default_dtype": self.default_dtype,
            "devices": [],
        }
        if ok:
            try:
                info["devices"] = [self._describe_device(index) for index in range(self.device_count())]
            except Exception as exc:  # a driver that fails a query must not hide the rest
                info["error"] = f"{type(exc).__name__}: {exc}"
        return info

    def _describe_device(self, index: int) -> dict:
        device = {"device": self.device(index), "name": self.device_name(index)}
        try:
            memory = self.memory_info(index)
        except NotImplementedError:
            return device
        return {**device, "total_bytes": memory.total_bytes, "free_bytes": memory.free_bytes}
