"""Reader for CTranslate2's ``model.bin``: a flat list of named arrays, no ctranslate2 needed.

Layout (little endian; strings are a uint16 byte length followed by NUL-terminated UTF-8):
``uint32 version`` (>= 2: ``string spec_name``, ``uint32 spec_revision``), ``uint32 count``, then
per variable ``string name``, ``uint8 rank``, ``rank x uint32 dims``, ``uint8 dtype``,
``uint32 nbytes`` and the raw data; then (version >= 3) ``uint32 aliases`` and per alias
``string alias``, ``string target``. Versions before 4 stored an item size instead of a dtype.
The file is mapped, not read: only the variables converted are read from disk.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

# CTranslate2's DataType enum, in order.
_DTYPES = {
    0: np.float32,
    1: np.int8,
    2: np.int16,
    3: np.int32,
    4: np.float16,
    5: "bfloat16",
}
_LEGACY_ITEM_SIZES = {4: np.float32, 2: np.int16, 1: np.int8}


class CT2FormatError(ValueError):
    """The file is not a CTranslate2 model this reader understands."""


@dataclass(frozen=True)
class Unread:
    """A variable left on disk (``read_ct2_model(..., data=False)``): its shape only."""

    shape: tuple[int, ...]


@dataclass
class CT2Model:
    spec: str
    revision: int
    variables: dict[str, np.ndarray | Unread] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray | Unread:
        return self.variables[name]

    def scalar(self, name: str, default=None):
        value = self.variables.get(name)
        return default if value is None else value.reshape(-1)[0].item()


class _Cursor:
    def __init__(self, data: memoryview, path: Path):
        self.data, self.offset, self.path = data, 0, path

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.offset + size > len(self.data):
            raise CT2FormatError(f"{self.path}: truncated at byte {self.offset}")
        (value,) = struct.unpack_from(fmt, self.data, self.offset)
        self.offset += size
        return value

    def string(self) -> str:
        length = self.take("<H")
        raw = bytes(self.data[self.offset : self.offset + length])
        self.offset += length
        return raw.rstrip(b"\0").decode("utf-8")

    def raw(self, nbytes: int) -> memoryview:
        if self.offset + nbytes > len(self.data):
            raise CT2FormatError(f"{self.path}: variable data runs past the end of the file")
        chunk = self.data[self.offset : self.offset + nbytes]
        self.offset += nbytes
        return chunk


def _to_array(chunk: memoryview, dtype, dims: list[int]) -> np.ndarray:
    if dtype == "bfloat16":  # numpy has no bfloat16: widen to float32 through the high half-words
        halves = np.frombuffer(chunk, dtype=np.uint16).astype(np.uint32) << 16
        return halves.view(np.float32).reshape(dims)
    return np.frombuffer(chunk, dtype=dtype).reshape(dims).copy()


def read_ct2_model(path: str | Path, data: bool = True) -> CT2Model:
    """Read every variable of a ``model.bin``; aliases point at the same array as their target.
    With ``data=False`` only scalars are read, other variables are ``Unread`` shapes (what a
    model's configuration needs, without its weights)."""
    path = Path(path)
    with open(path, "rb") as f:
        if path.stat().st_size == 0:
            raise CT2FormatError(f"{path}: truncated at byte 0")
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    try:
        return _read(_Cursor(view, path), path, data)
    finally:
        view.release()
        mapped.close()


def _read(cursor: _Cursor, path: Path, data: bool) -> CT2Model:
    version = cursor.take("<I")
    if not 1 <= version <= 6:
        raise CT2FormatError(f"{path}: unsupported CTranslate2 binary version {version}")
    spec, revision = "", 1
    if version >= 2:
        spec, revision = cursor.string(), cursor.take("<I")
    model = CT2Model(spec=spec, revision=revision)
    for _ in range(cursor.take("<I")):
        name = cursor.string()
        dims = [cursor.take("<I") for _ in range(cursor.take("<B"))]
        if version >= 4:
            code = cursor.take("<B")
            if code not in _DTYPES:
                raise CT2FormatError(f"{path}: variable {name!r} has unknown dtype code {code}")
            dtype, nbytes = _DTYPES[code], cursor.take("<I")
        else:
            item_size = cursor.take("<B")
            dtype = _LEGACY_ITEM_SIZES[item_size]
            nbytes = cursor.take("<I") * item_size
        chunk = cursor.raw(nbytes)
        small = nbytes <= 16  # scalars (head counts) are read either way
        model.variables[name] = _to_array(chunk, dtype, dims) if data or small else Unread(tuple(dims))
        chunk.release()
    if version >= 3:
        for _ in range(cursor.take("<I")):
            alias, target = cursor.string(), cursor.string()
            model.variables[alias] = model.variables[target]
    if cursor.offset != len(cursor.data):
        raise CT2FormatError(f"{path}: {len(cursor.data) - cursor.offset} unread bytes after the last variable")
    return model
