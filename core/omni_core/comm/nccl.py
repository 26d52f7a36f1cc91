"""GPU-to-GPU transport: tensors move by torch.distributed point-to-point (NCCL) between stage
processes; the msgpack metadata still travels on the control plane.

Selecting it where it cannot run fails at once with the reason and the alternatives.
"""

from __future__ import annotations

from typing import Any

from omni_core.comm.base import Transport, TransportUnavailable


def nccl_unavailable_reason() -> str | None:
    """Why NCCL cannot run here, or None when it can."""
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return "this torch build has no torch.distributed"
    if not torch.cuda.is_available():
        return "no CUDA device is visible" if torch.version.cuda else "this torch build has no CUDA support"
    if not dist.is_nccl_available():
        return "this torch build has no NCCL backend"
    return None


class NcclTransport(Transport):
    name = "nccl"

    def __init__(self, prefix: str = "omni", **options: Any):
        super().__init__(prefix, **options)
        reason = nccl_unavailable_reason()
        if reason is not None:
            raise TransportUnavailable(
                f"transport 'nccl' needs CUDA GPUs with NCCL: {reason}; "
                "use 'shm' between processes of one host or 'zmq' across hosts"
            )
        raise TransportUnavailable(
            "transport 'nccl' is not wired into stage processes yet; use 'shm' or 'zmq'"
        )

    def pack(self, request_id: str, payload: dict[str, Any]) -> list[Any]:  # pragma: no cover
        raise TransportUnavailable("nccl transport is not available")

    def unpack(self, frames: list[Any]) -> dict[str, Any]:  # pragma: no cover
        raise TransportUnavailable("nccl transport is not available")
