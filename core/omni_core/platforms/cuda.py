from __future__ import annotations

from omni_core.platforms.torch_accelerator import TorchAcceleratorPlatform


class CudaPlatform(TorchAcceleratorPlatform):
    name = "cuda"
    device_type = "cuda"
    dist_backend = "nccl"
    supports_graphs = True
    priority = 10
    attention_backend = "triton"  # the engine falls back to sdpa where triton does not import
    ray_resource = "GPU"

    def is_available(self) -> tuple[bool, str]:
        import torch

        if not torch.cuda.is_available():
            built = torch.version.cuda
            return False, "no CUDA device visible" if built else "this torch build has no CUDA support"
        return True, ""
