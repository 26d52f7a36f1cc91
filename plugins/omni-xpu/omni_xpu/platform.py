"""The ``xpu`` platform: Intel GPUs through torch's XPU build. Families run on it unchanged:
eager (omni's graph capture is CUDA's), SDPA attention, ``xccl`` between processes."""

from __future__ import annotations

from omni_core.platforms import TorchAcceleratorPlatform

XPU_TORCH_INDEX = "https://download.pytorch.org/whl/xpu"


class XpuPlatform(TorchAcceleratorPlatform):
    """Devices, memory, streams and events come from ``torch.xpu``, as CUDA's from ``torch.cuda``."""

    name = "xpu"
    device_type = "xpu"
    dist_backend = "xccl"
    supports_graphs = False
    priority = 5  # below cuda, the better-tested backend where a machine has both; above cpu
    attention_backend = "sdpa"

    def is_available(self) -> tuple[bool, str]:
        try:
            import torch
        except Exception as exc:  # a broken install is reported, never fatal
            return False, f"torch is not importable: {exc}"
        xpu = getattr(torch, "xpu", None)
        if xpu is None:
            return False, f"torch {torch.__version__} has no torch.xpu (XPU support needs torch 2.4 or later)"
        try:
            if xpu.is_available():
                return True, ""
            xpu.init()  # not usable: torch's own words say why (no XPU build, no device, the driver)
        except Exception as exc:
            reason = f"torch {torch.__version__}: {str(exc).strip() or type(exc).__name__}"
        else:
            reason = f"torch {torch.__version__} finds no XPU device"
        if getattr(torch.version, "xpu", None) is None:
            reason += f" (Intel GPUs need torch's XPU build: pip install torch --index-url {XPU_TORCH_INDEX})"
        return False, reason

    @property
    def dtypes(self) -> tuple[str, ...]:
        """float64 only on devices with FP64 units (Arc GPUs have none); bfloat16 where torch
        says the device has it."""
        if not self.is_available()[0]:
            return ("float32", "bfloat16", "float16")
        import torch

        names = ["float32", "float16"]
        if torch.xpu.is_bf16_supported():
            names.append("bfloat16")
        if getattr(torch.xpu.get_device_properties(0), "has_fp64", True):
            names.append("float64")
        return tuple(names)

    @property
    def default_dtype(self) -> str:
        return "bfloat16" if "bfloat16" in self.dtypes else "float16"
