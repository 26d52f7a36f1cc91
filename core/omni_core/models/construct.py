"""Building modules straight on a device in a dtype, for the calling thread alone.

A real-size model built in float32 first and cast after would need twice its memory (a 30B model
does not fit), so its parameters must be made in the target dtype. ``torch.set_default_dtype``
does that for the whole process, and a pipeline's stages load in parallel threads: one stage's
restore of the default can land inside another's build, which then makes float32 weights beside
bfloat16 ones. ``constructing`` gives the same effect through a torch function mode, which is
thread-local: factory calls that would make a tensor of the default floating dtype make one of
``dtype``; those that name their dtype (a rotary table kept in float32) are left as they are.
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

# factories whose floating result has the default dtype unless told: given ``dtype`` up front
_FLOAT_FACTORIES = {torch.empty, torch.empty_strided, torch.zeros, torch.ones, torch.rand, torch.randn}
# factories whose dtype follows their data (a float fill, float range ends, float values): cast after
_INFERRING_FACTORIES = {torch.full, torch.tensor, torch.as_tensor, torch.arange, torch.linspace, torch.scalar_tensor}


class _DefaultFloatDtype(TorchFunctionMode):
    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if kwargs.get("dtype") is not None:
            return func(*args, **kwargs)
        if func in _FLOAT_FACTORIES:
            kwargs["dtype"] = self.dtype
            return func(*args, **kwargs)
        result = func(*args, **kwargs)
        if func in _INFERRING_FACTORIES and isinstance(result, torch.Tensor) and result.dtype == torch.get_default_dtype():
            return result.to(self.dtype)
        return result


@contextlib.contextmanager
def constructing(device: str | torch.device, dtype: torch.dtype):
    """Within: modules built in this thread get their parameters and default-dtype buffers on
    ``device`` in ``dtype``; other threads and the process's default dtype are untouched."""
    with torch.device(device), _DefaultFloatDtype(dtype):
        yield
