"""Shared-memory transport between processes of one host.

The sender writes a message's tensors into a segment under /dev/shm and sends only its name and
layout; the receiver maps it and wraps the tensors over the mapping with ``torch.frombuffer``
(no copy). Three paths, by size:

- up to ``inline_bytes`` (64 KiB) of tensor data: no segment, the bytes ride in one zmq frame
  (a segment costs a handful of syscalls per side);
- otherwise a pooled segment (``shm_pool``), reused once the receiver has freed the tensors
  over it, up to ``pool_bytes`` (1 GiB) per sending process;
- beyond the pool, a one-off segment ``<prefix>-<request tag>-<pid>-<n>`` that the receiver
  unlinks as soon as it has mapped it.

Nothing outlives the pipeline: ``release(request_id)`` retires what a finished or aborted request
still holds (a message never received, a receiver still holding data), ``release_process(pid)``
what a dead stage process left, and ``close()`` every segment of the prefix.
"""

from __future__ import annotations

import glob
import hashlib
import itertools
import mmap
import os
from typing import Any

from omni_core.comm import framing
from omni_core.comm.base import Transport, TransportUnavailable
from omni_core.comm.shm_pool import CONTROL_BYTES, SegmentPool, map_for_receiver

SHM_DIR = "/dev/shm"
INLINE_BYTES = 64 << 10
POOL_BYTES = 1 << 30


def request_tag(request_id: str) -> str:
    return hashlib.blake2b(request_id.encode(), digest_size=6).hexdigest()


class ShmTransport(Transport):
    name = "shm"

    def __init__(self, prefix: str = "omni", **options: Any):
        super().__init__(prefix, **options)
        if not os.path.isdir(SHM_DIR):
            raise TransportUnavailable(f"transport 'shm' needs {SHM_DIR} (Linux); use 'zmq' here")
        self._counter = itertools.count()
        self.inline_bytes = int(options.get("inline_bytes", INLINE_BYTES))
        self.pool = SegmentPool(SHM_DIR, prefix, int(options.get("pool_bytes", POOL_BYTES)))

    def segment_paths(self, request_id: str | None = None) -> list[str]:
        """One-off segments of a request (or every segment of the prefix, pooled ones included)."""
        pattern = (
            f"{self.prefix}-{request_tag(request_id)}-*" if request_id is not None else f"{self.prefix}-*"
        )
        return glob.glob(os.path.join(SHM_DIR, pattern))

    # -- sending ----------------------------------------------------------------------------------

    def pack(self, request_id: str, payload: dict[str, Any], peer: int = 0) -> list[Any]:
        encoded = framing.encode(payload)
        offsets, size = framing.layout(encoded.meta)
        header: dict[str, Any] = {"body": encoded.body, "tensors": encoded.meta, "offsets": offsets}
        if size == 0:
            return [framing.pack_header(header)]
        if size <= self.inline_bytes:
            inline = bytearray(size)
            _copy_into(inline, encoded.tensors, offsets)
            header["inline"] = size
            return [framing.pack_header(header), inline]
        segment = self.pool.acquire(request_id, size)
        if segment is not None:
            shifted = [o + CONTROL_BYTES for o in offsets]
            _copy_into(segment.mapping, encoded.tensors, shifted)
            header.update(offsets=shifted, segment=segment.name, size=segment.capacity, pooled=True)
            return [framing.pack_header(header)]
        name = f"{self.prefix}-{request_tag(request_id)}-{os.getpid()}-{next(self._counter)}"
        self._write_one_off(name, size, encoded.tensors, offsets)
        header.update(segment=name, size=size)
        return [framing.pack_header(header)]

    def _write_one_off(self, name: str, size: int, tensors: list, offsets: list[int]) -> None:
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)) as mapping:
                _copy_into(mapping, tensors, offsets)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)

    # -- receiving --------------------------------------------------------------------------------

    def unpack(self, frames: list[Any], peer: int = 0) -> dict[str, Any]:
        header = framing.unpack_header(frames[0])
        meta, offsets = header.get("tensors", []), header.get("offsets", [])
        if len(offsets) != len(meta):
            raise framing.FramingError("shm frame: tensors and offsets differ in length")
        buffer: Any = b""
        if header.get("inline"):
            if len(frames) != 2:
                raise framing.FramingError("shm frame: inline tensors need exactly one data frame")
            buffer = frames[1].buffer if hasattr(frames[1], "buffer") else frames[1]
        elif header.get("segment"):
            buffer = self._map(str(header["segment"]), int(header["size"]), bool(header.get("pooled")))
        tensors = [framing.wrap(buffer, m, o) for m, o in zip(meta, offsets, strict=True)]
        return framing.decode(header["body"], tensors)

    def _map(self, name: str, size: int, pooled: bool) -> mmap.mmap:
        if "/" in name or not name.startswith(self.prefix + "-"):
            raise framing.FramingError(f"shm segment {name!r} is not one of this pipeline's")
        path = os.path.join(SHM_DIR, name)
        try:
            if pooled:
                return map_for_receiver(path, size)
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError as exc:
            raise framing.FramingError(f"shm segment {name!r} is gone (its request was released)") from exc
        except ValueError as exc:
            raise framing.FramingError(str(exc)) from exc
        try:
            if os.fstat(fd).st_size != size:
                raise framing.FramingError(f"shm segment {name!r} has the wrong size")
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)
            os.unlink(path)  # a one-off segment: the mapping lives on, the name does not

    # -- cleanup ----------------------------------------------------------------------------------

    def release(self, request_id: str) -> None:
        self.pool.release(request_id)
        for path in self.segment_paths(request_id):
            _unlink(path)

    def release_process(self, pid: int) -> None:
        for path in glob.glob(os.path.join(SHM_DIR, f"{self.prefix}-*-{pid}-*")):
            _unlink(path)

    def close(self) -> None:
        self.pool.close()
        for path in self.segment_paths():
            _unlink(path)


def _copy_into(buffer: Any, tensors: list, offsets: list[int]) -> None:
    for tensor, offset in zip(tensors, offsets, strict=True):
        if tensor.numel():
            nbytes = tensor.numel() * tensor.element_size()
            view = framing.wrap(buffer, {"dtype": "uint8", "shape": [nbytes], "nbytes": nbytes}, offset)
            view.copy_(framing.as_bytes(tensor))
            del view  # a mapping cannot close while a tensor still exports it


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
