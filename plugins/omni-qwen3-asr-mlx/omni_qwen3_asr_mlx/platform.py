"""The ``mlx`` platform: ``omni serve --device mlx`` runs MLX stages on MLX's default device
(Metal on Apple Silicon, the CPU elsewhere). Its priority is below ``cpu`` so that
``--device auto`` never hands a torch family an ``mlx`` device string."""

from __future__ import annotations

import os

from omni_core.platforms.base import MemoryInfo, Platform


class MLXPlatform(Platform):
    name = "mlx"
    device_type = "mlx"
    dist_backend = "gloo"
    priority = -10

    def is_available(self) -> tuple[bool, str]:
        try:
            import mlx.core  # noqa: F401
        except Exception as error:  # a broken install is reported, never fatal
            return False, f"mlx is not importable: {error}"
        return True, ""

    def memory_info(self, index: int = 0) -> MemoryInfo:
        import mlx.core as mx

        if mx.default_device() == mx.gpu and mx.metal.is_available():
            total = int(mx.metal.device_info().get("memory_size", 0))
            return MemoryInfo(total_bytes=total, free_bytes=max(0, total - mx.get_active_memory()))
        page = os.sysconf("SC_PAGE_SIZE")
        return MemoryInfo(page * os.sysconf("SC_PHYS_PAGES"), page * os.sysconf("SC_AVPHYS_PAGES"))


def mlx_device(choice: str | None):
    """MLX's device for the engine: its default (the GPU when Metal is there, else the CPU), or
    the one a stage option ``mlx_device`` ("cpu" or "gpu") names. omni's own device string does
    not decide it: ``--device auto`` resolves to ``cpu`` on a Mac, where MLX should use Metal."""
    import mlx.core as mx

    if choice in (None, "", "default"):
        return mx.default_device()
    if choice == "cpu":
        return mx.cpu
    if choice == "gpu":
        if not mx.is_available(mx.gpu):
            raise ValueError("mlx_device='gpu' but this MLX build has no GPU backend (Metal or CUDA)")
        return mx.gpu
    raise ValueError(f"mlx_device must be 'cpu', 'gpu' or 'default', got {choice!r}")
