"""Tensor framing: a payload becomes msgpack metadata plus raw tensor buffers, and back.

Plain values travel inside the msgpack body; each tensor (torch or numpy) is replaced there by
an extension record holding its index, and its bytes travel beside the body, however the
transport moves them. Nothing is pickled: a receiver only ever decodes msgpack and raw bytes,
and checks every dtype and size it is told before it wraps a buffer.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch

# Received zmq frames are read-only buffers; the tensors wrapped over them are the stage's to read.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)

TENSOR_EXT = 7
ALIGN = 64  # byte alignment of tensors packed into one buffer

DTYPES: dict[str, torch.dtype] = {
    str(dt).removeprefix("torch."): dt
    for dt in (
        torch.float32,
        torch.float64,
        torch.float16,
        torch.bfloat16,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


class FramingError(ValueError):
    """A payload that cannot cross a process boundary, or a frame that does not decode."""


@dataclass
class Encoded:
    """``body``: msgpack bytes; ``tensors``: contiguous CPU tensors; ``meta``: one dict per tensor."""

    body: bytes
    tensors: list[torch.Tensor]
    meta: list[dict[str, Any]]

    @property
    def nbytes(self) -> int:
        return sum(m["nbytes"] for m in self.meta)


def encode(payload: dict[str, Any], keep_device: Callable[[torch.Tensor], bool] | None = None) -> Encoded:
    """``keep_device(tensor)`` says which tensors stay where they are (a GPU transport);
    the others are copied to host memory."""
    tensors: list[torch.Tensor] = []
    meta: list[dict[str, Any]] = []

    def default(value: Any) -> Any:
        kind = "torch"
        if isinstance(value, np.ndarray):
            kind, value = "numpy", torch.from_numpy(np.ascontiguousarray(value))
        elif isinstance(value, np.generic):
            return value.item()
        elif isinstance(value, tuple):
            return list(value)
        if not isinstance(value, torch.Tensor):
            raise FramingError(
                f"a value of type {type(value).__name__} cannot cross a process boundary; "
                "send plain data (str, numbers, bool, None, bytes, lists, dicts) and tensors"
            )
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in DTYPES:
            raise FramingError(f"tensor dtype {value.dtype} cannot cross a process boundary")
        device = str(value.device)
        tensor = value.detach()
        tensor = (
            tensor if keep_device is not None and keep_device(tensor) else tensor.to("cpu")
        ).contiguous()
        meta.append(
            {
                "dtype": dtype,
                "shape": list(tensor.shape),
                "nbytes": tensor.numel() * tensor.element_size(),
                "kind": kind,
                "device": device,
            }
        )
        tensors.append(tensor)
        return msgpack.ExtType(TENSOR_EXT, (len(tensors) - 1).to_bytes(4, "little"))

    try:
        body = msgpack.packb(payload, default=default, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        if isinstance(exc, FramingError):
            raise
        raise FramingError(f"payload cannot be framed: {exc}") from exc
    return Encoded(body, tensors, meta)


def decode(body: bytes, tensors: list[Any]) -> dict[str, Any]:
    """Rebuild the payload; ``tensors[i]`` replaces the i-th extension record."""

    def ext_hook(code: int, data: bytes) -> Any:
        if code != TENSOR_EXT or len(data) != 4:
            raise FramingError(f"unknown extension record {code}")
        index = int.from_bytes(data, "little")
        if index >= len(tensors):
            raise FramingError(f"tensor {index} is missing from the frame ({len(tensors)} sent)")
        return tensors[index]

    try:
        payload = msgpack.unpackb(body, ext_hook=ext_hook, raw=False, strict_map_key=False)
    except FramingError:
        raise
    except Exception as exc:
        raise FramingError(f"payload does not decode: {exc}") from exc
    if not isinstance(payload, dict):
        raise FramingError(f"payload must decode to a dict, got {type(payload).__name__}")
    return payload


def as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a contiguous CPU tensor (no copy)."""
    return tensor.reshape(-1).view(torch.uint8) if tensor.numel() else torch.empty(0, dtype=torch.uint8)


def wrap(buffer: Any, meta: dict[str, Any], offset: int = 0) -> Any:
    """A tensor over ``buffer[offset:]`` (no copy) after checking what the sender claims."""
    dtype = DTYPES.get(meta.get("dtype"))
    if dtype is None:
        raise FramingError(f"unknown tensor dtype {meta.get('dtype')!r}")
    shape = [int(d) for d in meta["shape"]]
    if any(d < 0 for d in shape):
        raise FramingError(f"negative tensor shape {shape}")
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    nbytes = count * torch.empty(0, dtype=dtype).element_size()
    if nbytes != meta["nbytes"] or offset + nbytes > memoryview(buffer).nbytes:
        raise FramingError(f"tensor of {shape} {meta['dtype']} does not fit its {meta['nbytes']}-byte frame")
    if count == 0:
        tensor = torch.empty(shape, dtype=dtype)
    else:
        tensor = torch.frombuffer(buffer, dtype=dtype, count=count, offset=offset).reshape(shape)
    return tensor.numpy() if meta.get("kind") == "numpy" else tensor


def layout(meta: list[dict[str, Any]]) -> tuple[list[int], int]:
    """Aligned offsets for packing tensors into one buffer, and its total size."""
    offsets, size = [], 0
    for m in meta:
        size = (size + ALIGN - 1) // ALIGN * ALIGN
        offsets.append(size)
        size += m["nbytes"]
    return offsets, size


def pack_header(header: dict[str, Any]) -> bytes:
    return msgpack.packb(header, use_bin_type=True)


def unpack_header(frame: Any) -> dict[str, Any]:
    try:
        header = msgpack.unpackb(bytes(frame), raw=False)
    except Exception as exc:
        raise FramingError(f"control frame does not decode: {exc}") from exc
    if not isinstance(header, dict):
        raise FramingError("control frame must be a msgpack map")
    return header
