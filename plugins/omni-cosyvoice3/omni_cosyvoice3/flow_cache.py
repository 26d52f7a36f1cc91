"""The flow's finished frames, kept per request so a streamed request's later calls compute only
their new frames.

Under the chunk mask a frame sees only its own and earlier 50-frame chunks, every non-final call
of a streamed request ends on a chunk boundary, the noise is fixed per frame position and the
DiT's position conv is causal: so the frames of earlier calls evolve identically in every later
call. ``FlowCache`` keeps, per request, the DiT's keys and values of those frames for every
Euler step, block and CFG row, and the position conv's last ``kernel - 1`` inputs of each of its
two convs (its left context); a later call runs only its new frames as queries, against the
cached keys and its own.

Keys and values live in one pool of 50-frame blocks (block 0 is scratch for padded frames), the
pool sized by a byte budget and allocated when the stage starts (a budget the device cannot hold
fails there, naming the option, not in a request). A request whose next blocks do not fit
is refused: its blocks are freed and its later calls recompute everything, as without a cache.
The last call of a streamed request attends over all frames by default (the reference's rule),
so it does not use the cache; with the chunk mask (``flow_last_call=masked``) it does. The worker
frees the request's blocks after it.

A cached call (``CachedCall``) is described by tensors alone (pool slots to write and read,
absolute positions, ends, conv context), which ``CachedFrames`` turns into what the DiT reads
without a host value, so the call can be captured as a CUDA graph per padded bucket.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from omni_core.platforms import platform_for
from omni_core.scheduler.host_copy import to_device

from .config import FlowConfig


@dataclass
class CachedRequest:
    frames: int = 0  # frames (prompt included) whose keys and values are in the pool
    blocks: list[int] = field(default_factory=list)  # pool blocks, in frame order
    conv_context: torch.Tensor | None = None  # [steps, 2 CFG rows, 2 convs, kernel - 1, dim]


class FlowCache:
    def __init__(
        self,
        cfg: FlowConfig,
        budget_bytes: int,
        device: torch.device,
        dtype: torch.dtype,
        conv_kernel: int = 31,
        use_graphs: bool = False,
    ):
        self.cfg, self.device, self.dtype = cfg, torch.device(device), dtype
        self.block = cfg.static_chunk_size
        self.context = conv_kernel - 1
        self.inner = cfg.heads * cfg.dim_head
        item = torch.empty(0, dtype=dtype).element_size()
        # keys and values of one frame: every Euler step, block and CFG row
        self.frame_bytes = 2 * cfg.n_timesteps * cfg.depth * 2 * self.inner * item
        self.conv_shape = (cfg.n_timesteps, 2, 2, self.context, cfg.dim)  # a request's conv context
        self.blocks_total = max(0, int(budget_bytes) // (self.frame_bytes * self.block))
        self.free_blocks = list(range(self.blocks_total, 0, -1))  # pop() hands out block 1 first
        self.requests: dict[str, CachedRequest] = {}
        self.refused: set[str] = set()
        self.keys: torch.Tensor | None = None  # [steps, depth, 2 CFG rows, slots, inner]
        self.values: torch.Tensor | None = None
        # cached calls as CUDA graphs where the flow has graphs (``flow_cache_graphs``)
        self.use_graphs = use_graphs
        self.graphs = None  # GraphBuckets of (batch, query frames, key frames), made on first use
        if self.blocks_total:
            self._pool(int(budget_bytes))

    def _pool(self, budget_bytes: int) -> None:
        slots = (self.blocks_total + 1) * self.block
        shape = (self.cfg.n_timesteps, self.cfg.depth, 2, slots, self.inner)
        try:
            # zeros, not empty: padded keys are masked, but a NaN there would still poison softmax
            self.keys = torch.zeros(shape, device=self.device, dtype=self.dtype)
            self.values = torch.zeros(shape, device=self.device, dtype=self.dtype)
        except RuntimeError:  # torch.OutOfMemoryError on an accelerator, the allocator's error on the host
            self.keys = self.values = None
            free = platform_for(self.device).memory_info(self.device.index).free_bytes
            room = f" ({free / 2**30:.1f} GiB free after the stage's weights and graphs)"
            raise ValueError(f"cosyvoice3: flow_cache_bytes={budget_bytes} does not fit on {self.device}{room}: lower it") from None

    def cached_frames(self, request_id: str) -> int:
        entry = self.requests.get(request_id)
        return 0 if entry is None else entry.frames

    def reserve(self, request_id: str, frames: int, last: bool = False) -> bool:
        """Whether a call that ends at ``frames`` (prompt included) can run on the cache; takes
        the blocks its new frames need. Only a request's ``last`` call may end inside a chunk
        (no later call reads its frames). A request refused once stays refused."""
        if request_id in self.refused or self.blocks_total == 0:
            return False
        entry = self.requests.get(request_id) or CachedRequest()
        if (frames % self.block and not last) or frames <= entry.frames:
            return False  # not on a chunk boundary: these frames may still change
        need = -(-frames // self.block) - len(entry.blocks)
        if need > len(self.free_blocks):
            self.free(request_id)
            self.refused.add(request_id)
            return False
        entry.blocks.extend(self.free_blocks.pop() for _ in range(need))
        self.requests[request_id] = entry
        return True

    def commit(self, request_id: str, frames: int, conv_context: torch.Tensor) -> None:
        """The call that reserved ``frames`` wrote its keys and values: they count from now on."""
        entry = self.requests[request_id]
        entry.frames, entry.conv_context = frames, conv_context

    def free(self, request_id: str) -> None:
        entry = self.requests.pop(request_id, None)
        if entry is not None:
            self.free_blocks.extend(reversed(entry.blocks))
        self.refused.discard(request_id)

    def bytes_in_use(self) -> int:
        return (self.blocks_total - len(self.free_blocks)) * self.block * self.frame_bytes

    def slots(self, request_id: str, start: int, end: int) -> torch.Tensor:
        """Pool slots of frames [start, end) of a request (on the host)."""
        blocks = torch.tensor(self.requests[request_id].blocks[start // self.block : -(-end // self.block)])
        first = start // self.block * self.block
        slots = (blocks[:, None] * self.block + torch.arange(self.block)[None, :]).flatten()
        return slots[start - first : end - first]

    def batch(self, request_ids: list[str], ends: list[int]) -> CachedCall:
        """A cached call of these requests, each ending at its frame in ``ends`` (prompt included)."""
        return CachedCall(self, request_ids, ends)


class CachedCall:
    """One cached flow call on the host side: each row's new frames [start, end) are its queries,
    against its frames [0, end) in the pool. ``inputs`` are its tensors (on the device), which
    ``CachedFrames`` turns into what the DiT reads; ``commit`` records what the call computed."""

    def __init__(self, cache: FlowCache, request_ids: list[str], ends: list[int]):
        self.cache, self.request_ids, self.ends = cache, request_ids, ends
        self.starts = [cache.cached_frames(r) for r in request_ids]
        self.new = [e - s for s, e in zip(self.starts, ends, strict=True)]
        b, n_max, t_max = len(request_ids), max(self.new), max(ends)
        write = torch.zeros(b, n_max, dtype=torch.long)
        read = torch.zeros(b, t_max, dtype=torch.long)
        contexts = []
        for i, (rid, s, e) in enumerate(zip(request_ids, self.starts, ends, strict=True)):
            read[i, :e] = cache.slots(rid, 0, e)
            write[i, : e - s] = read[i, s:e]
            ctx = cache.requests[rid].conv_context
            # zeros before the first frame: what the position conv's padding gives
            contexts.append(ctx if ctx is not None else torch.zeros(cache.conv_shape, device=cache.device))
        starts = torch.tensor(self.starts)
        # a padded frame past the longest row's end takes the last position
        positions = (starts[:, None] + torch.arange(n_max)[None, :]).clamp(max=t_max - 1)
        # every integer of the call goes over in one copy that waits for nothing (host_copy)
        parts = [positions, torch.tensor(ends), torch.tensor(self.new), write, read]
        on_device = to_device(torch.cat([x.reshape(-1) for x in parts]), cache.device)
        positions, ends_t, new_t, write, read = on_device.split([x.numel() for x in parts])
        self.inputs = {
            "positions": positions.view(b, n_max),  # absolute frames of the queries
            "ends": ends_t,
            "new": new_t,
            "write": write.view(b, n_max),  # pool slots the new frames fill
            "read": read.view(b, t_max),  # pool slots of all frames
            "conv": torch.stack(contexts, dim=2).to(cache.dtype),  # [steps, 2 CFG, B, 2 convs, ctx, dim]
        }

    def commit(self, conv: torch.Tensor) -> None:
        """``conv`` [steps, 2 CFG, B, 2, ctx, dim]: each row's position-conv context after the call."""
        for i, (rid, end) in enumerate(zip(self.request_ids, self.ends, strict=True)):
            self.cache.commit(rid, end, conv[:, :, i].clone())


def pad_to(x: torch.Tensor, shape: tuple[int, ...], fill) -> torch.Tensor:
    """``x`` in the corner of a ``shape`` tensor filled with ``fill``."""
    out = x.new_full(shape, fill)
    out[tuple(slice(0, n) for n in x.shape)] = x
    return out


def pad_cached_inputs(inputs: dict[str, torch.Tensor], batch: int, frames: int, keys: int) -> dict[str, torch.Tensor]:
    """Pad a cached call's tensors to ``batch`` rows, ``frames`` queries and ``keys`` keys: padded
    frames and dummy rows write to and read from the scratch block, and a dummy row has one key
    (no empty softmax); the real rows' real frames are unchanged."""
    conv = inputs["conv"]
    out = {
        "positions": pad_to(inputs["positions"], (batch, frames), 0),
        "ends": pad_to(inputs["ends"], (batch,), 1),
        "new": pad_to(inputs["new"], (batch,), 0),
        "write": pad_to(inputs["write"], (batch, frames), 0),
        "read": pad_to(inputs["read"], (batch, keys), 0),
        "conv": pad_to(conv, (*conv.shape[:2], batch, *conv.shape[3:]), 0),
    }
    for name in ("mu", "cond"):
        if name in inputs:
            out[name] = pad_to(inputs[name], (batch, inputs[name].shape[1], frames), 0)
    if "spks" in inputs:
        out["spks"] = pad_to(inputs["spks"], (batch, inputs["spks"].shape[1]), 0)
    return out


class CachedFrames:
    """What the DiT reads of a cached call, built from its tensors alone (no host values, so a
    CUDA graph can capture it): the chunk mask and rotary tables at each query's absolute frame,
    the pool's keys/values of each block and Euler step, the position conv's context. The Euler
    loop asks ``at(step)`` before each step."""

    def __init__(self, cache: FlowCache, positions, ends, new, write, read, conv):
        self.cache, self.write, self.read = cache, write, read
        b, n = positions.shape
        t, dev = read.shape[1], positions.device
        self.positions = positions
        self.valid = torch.arange(n, device=dev)[None, :] < new[:, None]
        keys = torch.arange(t, device=dev)[None, None, :]
        reach = (positions // cache.block + 1) * cache.block
        mask = (keys < reach[:, :, None]) & (keys < ends[:, None, None])  # the chunk mask, keys that exist
        self.mask = torch.cat([mask, mask])[:, None]  # [2B, 1, n, t]
        last = new[:, None] + torch.arange(cache.context, device=dev)[None, :]
        self.last = torch.cat([last, last])  # each row's last kernel - 1 frames in (context + new)
        self.conv_in = conv.flatten(1, 2)  # [steps, 2B, 2, ctx, dim]: conditional rows, then unconditional
        self.conv_out = torch.empty_like(self.conv_in)
        self.step, self._rope = 0, None

    def at(self, step: int) -> CachedFrames:
        self.step = step
        return self

    def rope(self, rotary, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The rotary tables at each query's absolute frame, [2B, n, width] (once a call)."""
        if self._rope is None:
            cos, sin = rotary.tables(self.read.shape[1], width)
            cos, sin = cos[self.positions], sin[self.positions]
            self._rope = torch.cat([cos, cos]), torch.cat([sin, sin])
        return self._rope

    def conv_context(self) -> torch.Tensor:
        return self.conv_in[self.step]

    def keep_conv_context(self, context: torch.Tensor) -> None:
        self.conv_out[self.step] = context

    def last_frames(self) -> torch.Tensor:
        return self.last

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new frames' keys/values [2B, n, inner] into the pool (padded frames into
        the scratch block); return every frame's, [2B, t, inner]."""
        b = self.write.shape[0]
        pool_k, pool_v = self.cache.keys[self.step, layer], self.cache.values[self.step, layer]
        pool_k[:, self.write] = k.unflatten(0, (2, b))
        pool_v[:, self.write] = v.unflatten(0, (2, b))
        return pool_k[:, self.read].flatten(0, 1), pool_v[:, self.read].flatten(0, 1)

    def conv_rows(self) -> torch.Tensor:
        """The conv context after the call, [steps, 2 CFG, B, 2, ctx, dim]."""
        return self.conv_out.unflatten(1, (2, -1))
