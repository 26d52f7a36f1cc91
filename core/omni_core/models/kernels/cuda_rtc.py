"""CUDA C++ kernels compiled at run time: NVRTC compiles a source for the device's architecture,
the driver loads the binary, and launches go onto torch's current stream (so CUDA graphs capture
them like any other kernel).

Both libraries are reached through ``ctypes``: NVRTC is the one torch's CUDA build loads (or one
named by ``OMNI_NVRTC``), the driver is ``libcuda.so.1``. Nothing is built at install time, and
where either library is missing ``compile_source`` / ``CudaKernel`` raise ``CudaRtcError`` and
callers keep their other path.
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import sys
from pathlib import Path

import torch

NVRTC_ENV = "OMNI_NVRTC"
FUNC_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
LAUNCH_ATTRIBUTE_COOPERATIVE = 2  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE


class CudaRtcError(RuntimeError):
    pass


def _nvrtc_candidates() -> list[str]:
    names = []
    if os.environ.get(NVRTC_ENV):
        names.append(os.environ[NVRTC_ENV])
    major = (torch.version.cuda or "12").split(".")[0]
    names += [f"libnvrtc.so.{major}", "libnvrtc.so"]
    for root in sys.path:  # the pip packages torch's CUDA build depends on
        names += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libnvrtc.so*")))
        names += sorted(glob.glob(os.path.join(root, "nvidia", "*", "*", "lib", "libnvrtc.so*")))
    names += sorted(glob.glob("/usr/local/cuda*/lib64/libnvrtc.so*"))
    return [n for n in names if "builtins" not in n and ".alt." not in n]


@functools.cache
def nvrtc() -> ctypes.CDLL:
    errors = []
    for name in _nvrtc_candidates():
        try:
            return ctypes.CDLL(name)
        except OSError as exc:
            errors.append(str(exc))
    raise CudaRtcError(f"NVRTC not found ({'; '.join(errors[:3]) or 'no candidates'}); set {NVRTC_ENV} to its path")


@functools.cache
def driver() -> ctypes.CDLL:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise CudaRtcError(f"the CUDA driver library does not load: {exc}") from exc


def _check(result: int, what: str) -> None:
    if result != 0:
        message = ctypes.c_char_p()
        driver().cuGetErrorString(result, ctypes.byref(message))
        raise CudaRtcError(f"{what} failed: {message.value.decode() if message.value else result}")


def compile_source(source: str, arch: str, name: str = "kernel.cu", options: tuple[str, ...] = ()) -> tuple[bytes, str]:
    """(cubin, compiler log) of ``source`` for ``arch`` (e.g. ``sm_90a``); raises CudaRtcError with
    the log when it does not compile. Needs no GPU."""
    lib = nvrtc()
    prog = ctypes.c_void_p()
    _nvrtc_check(lib, lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None), "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture={arch}", "--std=c++17", *options]
        array = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
        compiled = lib.nvrtcCompileProgram(prog, len(opts), array)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetProgramLog(prog, log)
        text = log.value.decode(errors="replace")
        if compiled != 0:
            raise CudaRtcError(f"{name} does not compile for {arch}:\n{text}")
        _nvrtc_check(lib, lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        _nvrtc_check(lib, lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin.raw, text
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


COMMON_HEADER = Path(__file__).with_name("cuda_common.cuh")


def compile_kernel(source: Path, defines: dict[str, int], arch: str) -> bytes:
    """The cubin of the kernel file ``source`` for ``arch``, compiled after
    ``#define`` lines for ``defines`` and the shared helpers of ``cuda_common.cuh``."""
    text = "".join(f"#define {k} {v}\n" for k, v in defines.items()) + COMMON_HEADER.read_text() + source.read_text()
    cubin, _ = compile_source(text, arch, source.name)
    return cubin


def _nvrtc_check(lib, result: int, what: str) -> None:
    if result != 0:
        lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        raise CudaRtcError(f"{what} failed: {lib.nvrtcGetErrorString(result).decode()}")


def device_arch(device: torch.device) -> str:
    """The NVRTC target of ``device``: ``sm_90a`` on Hopper (its bulk-copy and mbarrier
    instructions), ``sm_XY`` elsewhere."""
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}{'a' if major == 9 else ''}"


class _LaunchAttribute(ctypes.Structure):
    # the value as bytes, not c_char: a c_char array field stops copying at the first zero byte
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):
    _fields_ = [
        ("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
        ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
        ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
        ("attrs", ctypes.POINTER(_LaunchAttribute)), ("num_attrs", ctypes.c_uint),
    ]


def _make_current(device: torch.device) -> None:
    """The device's primary context current on this thread (torch's runtime calls set it lazily)."""
    lib = driver()
    ctx = ctypes.c_void_p()
    _check(lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        index = device.index if device.index is not None else torch.cuda.current_device()
        dev = ctypes.c_int()
        _check(lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
        _check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
        _check(lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


class CudaKernel:
    """One ``extern "C"`` kernel of a loaded cubin on one device."""

    def __init__(self, cubin: bytes, name: str, device: torch.device, shared_bytes: int = 0):
        torch.cuda.init()
        self.device = device
        _make_current(device)
        lib = driver()
        self._module = ctypes.c_void_p()
        _check(lib.cuModuleLoadData(ctypes.byref(self._module), ctypes.c_char_p(cubin)), "cuModuleLoadData")
        self._func = ctypes.c_void_p()
        _check(lib.cuModuleGetFunction(ctypes.byref(self._func), self._module, name.encode()), f"cuModuleGetFunction({name})")
        self.shared_bytes = shared_bytes
        if shared_bytes > 48 * 1024:
            _check(lib.cuFuncSetAttribute(self._func, FUNC_MAX_DYNAMIC_SHARED, shared_bytes), "cuFuncSetAttribute")

    def blocks_per_multiprocessor(self, threads: int) -> int:
        count = ctypes.c_int()
        _check(driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(count), self._func, threads, ctypes.c_size_t(self.shared_bytes)),
               "cuOccupancyMaxActiveBlocksPerMultiprocessor")
        return count.value

    def launch(self, grid: int, threads: int, params: ctypes.Structure, cooperative: bool = False) -> None:
        """Launches on torch's current stream with ``params`` (one struct, passed by value).
        ``cooperative``: all blocks resident at once, as a grid-wide barrier needs."""
        _make_current(self.device)
        attrs = (_LaunchAttribute * 1)()
        attrs[0].id = LAUNCH_ATTRIBUTE_COOPERATIVE
        attrs[0].value = (ctypes.c_ubyte * 64).from_buffer_copy((1).to_bytes(4, "little") + bytes(60))
        stream = torch.cuda.current_stream(self.device).cuda_stream
        config = _LaunchConfig(grid, 1, 1, threads, 1, 1, self.shared_bytes, ctypes.c_void_p(stream),
                               attrs if cooperative else None, 1 if cooperative else 0)
        args = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.pointer(params), ctypes.c_void_p))
        _check(driver().cuLaunchKernelEx(ctypes.byref(config), self._func, args, None), "cuLaunchKernelEx")
