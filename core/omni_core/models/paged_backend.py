"""``TritonPagedBackend``: fused Triton kernels for the paged KV cache, and how an engine picks its
attention backend.

Decode (one query token per sequence) runs one kernel per layer for rotary + cache write and one
for paged attention read straight through the block tables (plus a small combine kernel when the
context is split across programs); prefill keeps ``SdpaBackend``'s per-sequence path after the
same fused rotary + cache write. With this backend the Qwen backbones also use their fused
residual-add + RMSNorm and SiLU-gate kernels (``fused_ops``), and decode steps of up to
``kernels.SKINNY_MAX_ROWS`` sequences fold norm, projection, rotary and cache write into one
kernel per projection (``fuses_decode_rows``, ``attend_cached``).
"""

from __future__ import annotations

import os

import torch

from omni_core.models import kernels
from omni_core.models.attention import AttentionMetadata, SdpaBackend, store_kv
from omni_core.platforms import platform_for

BACKEND_ENV = "OMNI_ATTENTION_BACKEND"


class TritonPagedBackend:
    name = "triton"
    fuses_rotary = True
    fused_ops = True

    def __init__(self, num_splits: int | None = None, fused_rows: bool = True):
        # num_splits: programs per (sequence, KV head) in decode; None picks from the grid size.
        # fused_rows: decode steps of few rows run the fused projection kernels (see fuses_decode_rows)
        self.num_splits = num_splits
        self.fused_rows = fused_rows
        self.prefill = SdpaBackend()

    def prepare(self, meta: AttentionMetadata) -> None:
        if meta.max_query_len > 1:
            self.prefill.prepare(meta)

    def forward(self, q, k, v, k_cache, v_cache, meta, scale, rope=None):
        if rope is not None:
            kernels.rotary_store_kv(q, k, v, rope[0], rope[1], k_cache, v_cache, meta.slot_mapping)
        else:
            store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        if meta.max_query_len > 1:
            return self.prefill.attend(q, k, v, k_cache, v_cache, meta, scale)
        return self.attend_cached(q, k_cache, v_cache, meta, scale)

    def attend_cached(self, q, k_cache, v_cache, meta, scale):
        """Decode attention once the step's K/V are in the cache (the fused projection wrote them)."""
        if q.stride(-1) != 1:
            q = q.contiguous()
        return kernels.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.block_size, scale, self.num_splits)

    def fuses_decode_rows(self, meta) -> bool:
        """Whether the step ``meta`` describes runs the fused projection kernels
        (``kernels.fused_linear``): a decode step (one query per sequence) of few sequences."""
        return self.fused_rows and meta.max_query_len == 1 and meta.context_lens.shape[0] <= kernels.SKINNY_MAX_ROWS


def resolve_attention_backend(choice, device: torch.device):
    """The backend an engine uses: an object is used as is; ``"sdpa"`` or ``"triton"`` by name
    (``"triton-unfused"``: the Triton backend without the fused projection kernels, for comparison);
    None picks ``$OMNI_ATTENTION_BACKEND`` if set, else the device's platform's
    (``Platform.attention_backend``: ``triton`` on CUDA, which falls back to ``sdpa`` when triton
    does not import; ``sdpa`` elsewhere)."""
    if choice is not None and not isinstance(choice, str):
        return choice
    device = torch.device(device)
    platform = platform_for(device)
    name = choice or os.environ.get(BACKEND_ENV)
    if not name:
        name = platform.attention_backend if platform.attention_backend != "triton" or kernels.triton_available() else "sdpa"
    if name == "sdpa":
        return SdpaBackend()
    if name in ("triton", "triton-unfused"):
        reason = kernels.triton_unavailable_reason()
        if reason is not None:
            raise ValueError(f"attention backend 'triton': {reason}")
        # omni's Triton kernels run where the platform picks them (CUDA) or in Triton's CPU interpreter
        if platform.attention_backend != "triton" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"attention backend 'triton' needs a CUDA device, not {device.type!r} (or TRITON_INTERPRET=1)")
        return TritonPagedBackend(fused_rows=name == "triton")
    raise ValueError(f"unknown attention backend {name!r}: expected 'sdpa' or 'triton'")
