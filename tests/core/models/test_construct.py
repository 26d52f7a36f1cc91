"""`constructing` builds modules on a device in a dtype for its own thread only: two threads
building at once, one in bfloat16 and one in float32, each get their own dtype throughout, the
process's default dtype never changes, and tensors that name their dtype keep it."""

import threading

import torch
from omni_core.models.construct import constructing


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.register_buffer("table", torch.arange(0, 8, 2, dtype=torch.float32), persistent=False)  # named: kept
        self.register_buffer("scale", torch.tensor([0.5]), persistent=False)  # inferred: follows the build's dtype


def test_threads_building_in_different_dtypes_do_not_mix():
    seen: dict[torch.dtype, set] = {torch.bfloat16: set(), torch.float32: set()}
    defaults = set()
    start = threading.Barrier(2)

    def build(dtype):
        start.wait()
        for _ in range(200):
            with constructing("cpu", dtype):
                block = Block()
            defaults.add(torch.get_default_dtype())
            seen[dtype] |= {p.dtype for p in block.parameters()} | {block.scale.dtype}
            assert block.table.dtype == torch.float32

    threads = [threading.Thread(target=build, args=(dtype,)) for dtype in seen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen == {torch.bfloat16: {torch.bfloat16}, torch.float32: {torch.float32}}
    assert defaults == {torch.float32} and torch.get_default_dtype() == torch.float32


def test_integer_tensors_stay_integer():
    with constructing("cpu", torch.bfloat16):
        ids = torch.arange(5)
        filled = torch.full((2,), 3)
    assert ids.dtype == torch.int64 and filled.dtype == torch.int64
