"""Shared-memory transport between processes of one host.

The sender writes a message's tensors into one new segment (``/dev/shm/<prefix>-<request>-...``)
and sends only its name and layout. The receiver maps the segment and unlinks it at once: the
tensors it wraps read the mapping directly (no copy), and the memory goes back to the system
when the last of them is freed, so nothing stays in /dev/shm. A segment whose message is never
received (the request was aborted, the receiver died) is unlinked by ``release(request_id)``;
``close()`` unlinks every segment of the prefix. Messages with at most ``inline_bytes``
(64 KiB) of tensor data skip the segment: their bytes ride in one zmq frame.
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

SHM_DIR = "/dev/shm"
INLINE_BYTES = 64 << 10  # messages with fewer tensor bytes travel in a frame, not a segment


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

    def segment_paths(self, request_id: str | None = None) -> list[str]:
        tag = request_tag(request_id) if request_id is not None else "*"
        return glob.glob(os.path.join(SHM_DIR, f"{self.prefix}-{tag}-*"))

    def pack(self, request_id: str, payload: dict[str, Any]) -> list[Any]:
        encoded = framing.encode(payload)
        offsets, size = framing.layout(encoded.meta)
        header: dict[str, Any] = {"body": encoded.body, "tensors": encoded.meta, "offsets": offsets}
        if 0 < size <= self.inline_bytes:
            # a segment costs a handful of syscalls per side: small tensors ride in one frame
            inline = bytearray(size)
            for tensor, offset in zip(encoded.tensors, offsets, strict=True):
                if tensor.numel():
                    framing.wrap(inline, _bytes_meta(tensor), offset).copy_(framing.as_bytes(tensor))
            header["inline"] = size
            return [framing.pack_header(header), inline]
        if size:
            name = f"{self.prefix}-{request_tag(request_id)}-{os.getpid()}-{next(self._counter)}"
            self._write(name, size, encoded.tensors, offsets)
            header.update(segment=name, size=size)
        return [framing.pack_header(header)]

    def _write(self, name: str, size: int, tensors: list, offsets: list[int]) -> None:
        path = os.path.join(SHM_DIR, name)
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, size)
            # populating the pages in one go is cheaper than a fault per page while copying
            with mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)) as mapping:
                for tensor, offset in zip(tensors, offsets, strict=True):
                    if tensor.numel():
                        view = framing.wrap(mapping, _bytes_meta(tensor), offset)
                        view.copy_(framing.as_bytes(tensor))
                        del view  # the mapping cannot close while a tensor still exports it
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)

    def unpack(self, frames: list[Any]) -> dict[str, Any]:
        header = framing.unpack_header(frames[0])
        meta, offsets = header.get("tensors", []), header.get("offsets", [])
        if len(offsets) != len(meta):
            raise framing.FramingError("shm frame: tensors and offsets differ in length")
        mapping: Any = None
        if header.get("inline"):
            if len(frames) != 2:
                raise framing.FramingError("shm frame: inline tensors need exactly one data frame")
            mapping = frames[1].buffer if hasattr(frames[1], "buffer") else frames[1]
        elif header.get("segment"):
            mapping = self._map(str(header["segment"]), int(header["size"]))
        tensors = [
            framing.wrap(mapping if mapping is not None else b"", m, o)
            for m, o in zip(meta, offsets, strict=False)
        ]
        return framing.decode(header["body"], tensors)

    def _map(self, name: str, size: int) -> mmap.mmap:
        if "/" in name or not name.startswith(self.prefix + "-"):
            raise framing.FramingError(f"shm segment {name!r} is not one of this pipeline's")
        path = os.path.join(SHM_DIR, name)
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError as exc:
            raise framing.FramingError(f"shm segment {name!r} is gone (its request was released)") from exc
        try:
            if os.fstat(fd).st_size != size:
                raise framing.FramingError(f"shm segment {name!r} has the wrong size")
            return mmap.mmap(fd, size)
        finally:
            os.close(fd)
            os.unlink(path)  # the mapping lives on; the name does not

    def release(self, request_id: str) -> None:
        for path in self.segment_paths(request_id):
            _unlink(path)

    def close(self) -> None:
        for path in self.segment_paths():
            _unlink(path)


def _bytes_meta(tensor) -> dict[str, Any]:
    nbytes = tensor.numel() * tensor.element_size()
    return {"dtype": "uint8", "shape": [nbytes], "nbytes": nbytes}


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
