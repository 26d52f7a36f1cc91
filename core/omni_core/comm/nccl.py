"""GPU-to-GPU transport: tensors move by torch.distributed point-to-point between the runtime
(rank 0) and its stage processes (ranks 1..n); the msgpack metadata still travels on the control
plane, and host tensors ride in its frames.

The runtime's transport hosts the rendezvous (``omni_core.comm.rendezvous``: a ``TCPStore`` on
the address it is given, its keys under a secret token) and tells each stage process its rank
and the token (``peer_options``, passed to the process as it is spawned). Every process joins the group in a background thread at construction,
so no process waits for another to start; ``pack``/``unpack`` wait for the group. Each direction
between the runtime and a stage process has its own communicator (two groups per pair), and
each side issues its sends (``flush``, after the frames) and receives (``unpack``) in frame
order, so the two directions never wait on each other.

``backend="gloo"`` runs the same code on host tensors (tests without GPUs). A stage process of
this transport cannot be replaced while the pipeline runs (``supports_restart = False``): a
group cannot re-admit a rank. Selecting ``nccl`` where CUDA or NCCL is missing fails at once.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch

from omni_core.comm import framing, rendezvous
from omni_core.comm.base import Transport, TransportUnavailable

JOIN_TIMEOUT_S = 300.0


def nccl_unavailable_reason() -> str | None:
    """Why NCCL cannot run here, or None when it can."""
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
    supports_restart = False

    def __init__(
        self,
        prefix: str = "omni",
        *,
        peers: int = 0,
        rank: int = 0,
        world_size: int | None = None,
        store: str | None = None,
        device: str | None = None,
        backend: str = "nccl",
        host: str = "127.0.0.1",
        token: str | None = None,
        **options: Any,
    ):
        super().__init__(prefix, **options)
        if backend == "nccl":
            reason = nccl_unavailable_reason()
            if reason is not None:
                raise TransportUnavailable(
                    f"transport 'nccl' needs CUDA GPUs with NCCL: {reason}; "
                    "use 'shm' between processes of one host or 'zmq' across hosts"
                )
            if device is None or not device.startswith("cuda"):
                raise TransportUnavailable(
                    f"transport 'nccl' needs the runtime and its stage processes on CUDA devices, got {device!r}"
                )
        elif backend != "gloo":
            raise TransportUnavailable(f"transport 'nccl': backend must be 'nccl' or 'gloo', got {backend!r}")
        self.backend = backend
        self.device = torch.device(device) if backend == "nccl" else torch.device("cpu")
        self.rank = rank
        self.world_size = world_size if world_size is not None else peers + 1
        timeout = timedelta(seconds=JOIN_TIMEOUT_S)
        if rank == 0:
            self.rendezvous = rendezvous.host(host, self.world_size, timeout, token)
        else:
            if store is None:
                raise TransportUnavailable(
                    "transport 'nccl': a stage process needs the runtime's store address"
                )
            self.rendezvous = rendezvous.join(store, token, rank, self.world_size, timeout)
        self.store = self.rendezvous.store
        self.store_address = self.rendezvous.address
        self._to_peer: dict[int, Any] = {}  # stage rank -> group for runtime -> stage
        self._from_peer: dict[int, Any] = {}  # stage rank -> group for stage -> runtime
        self._pending: dict[int, list[torch.Tensor]] = {}
        self._joined = threading.Event()
        self._join_error: BaseException | None = None
        if self.world_size > 1:
            threading.Thread(target=self._join, name="omni-nccl-join", daemon=True).start()
        else:
            self._joined.set()

    # -- group ------------------------------------------------------------------------------------

    def _join(self) -> None:
        import torch.distributed as dist

        try:
            if self.backend == "nccl":
                torch.cuda.set_device(self.device)
            dist.init_process_group(
                self.backend,
                store=self.store,
                rank=self.rank,
                world_size=self.world_size,
                timeout=timedelta(seconds=JOIN_TIMEOUT_S),
            )
            for peer in range(1, self.world_size):  # every rank creates every group, in one order
                self._to_peer[peer] = dist.new_group([0, peer], backend=self.backend)
                self._from_peer[peer] = dist.new_group([0, peer], backend=self.backend)
        except BaseException as exc:
            self._join_error = exc
        finally:
            self._joined.set()

    def _wait_joined(self) -> None:
        if not self._joined.wait(JOIN_TIMEOUT_S) or self._join_error is not None:
            raise TransportUnavailable(
                f"transport 'nccl': the process group did not form: {self._join_error}"
            )

    def _group(self, sender: int, receiver: int):
        return self._to_peer[receiver] if sender == 0 else self._from_peer[sender]

    def peer_options(self, peer: int) -> dict[str, Any]:
        return {
            "rank": peer,
            "world_size": self.world_size,
            "store": self.store_address,
            "token": self.rendezvous.token,
            "backend": self.backend,
        }

    # -- frames -----------------------------------------------------------------------------------

    def _travels_in_group(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == self.device.type

    def pack(self, request_id: str, payload: dict[str, Any], peer: int = 0) -> list[Any]:
        encoded = framing.encode(payload, keep_device=self._travels_in_group)
        frames: list[Any] = []
        direct: list[torch.Tensor] = []
        for tensor, meta in zip(encoded.tensors, encoded.meta, strict=True):
            if self._travels_in_group(tensor) and tensor.numel():
                meta["via"] = "group"
                direct.append(tensor)
            else:
                tensor = tensor.to("cpu")
                frames.append(framing.as_bytes(tensor).numpy())
        if direct:
            self._pending.setdefault(peer, []).extend(direct)
        header = framing.pack_header({"body": encoded.body, "tensors": encoded.meta})
        return [header, *frames]

    def flush(self, peer: int = 0) -> None:
        tensors = self._pending.pop(peer, [])
        if not tensors:
            return
        import torch.distributed as dist

        self._wait_joined()
        group = self._group(self.rank, peer)
        for tensor in tensors:
            dist.send(tensor, dst=peer, group=group)

    def unpack(self, frames: list[Any], peer: int = 0) -> dict[str, Any]:
        import torch.distributed as dist

        header = framing.unpack_header(_buffer(frames[0]))
        tensors, framed = [], iter(frames[1:])
        for meta in header.get("tensors", []):
            if meta.get("via") == "group":
                dtype = framing.DTYPES.get(meta.get("dtype"))
                if dtype is None:
                    raise framing.FramingError(f"unknown tensor dtype {meta.get('dtype')!r}")
                self._wait_joined()
                tensor = torch.empty([int(d) for d in meta["shape"]], dtype=dtype, device=self.device)
                dist.recv(tensor, src=peer, group=self._group(peer, self.rank))
                tensors.append(tensor)
            else:
                frame = next(framed, None)
                if frame is None:
                    raise framing.FramingError("a tensor frame is missing")
                tensors.append(framing.wrap(_buffer(frame), meta))
        return framing.decode(header["body"], tensors)

    def close(self) -> None:
        import torch.distributed as dist

        if self._joined.is_set() and self._join_error is None and dist.is_initialized():
            dist.destroy_process_group()


def _buffer(frame: Any) -> Any:
    return frame.buffer if hasattr(frame, "buffer") else frame
