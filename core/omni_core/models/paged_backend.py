"""``TritonPagedBackend``: fused Triton kernels for the paged KV cache, and how an engine picks its
attention backend.

Decode (one query token per sequence) runs one kernel per layer for rotary + cache write and one
for paged attention read straight through the block tables (plus a small combine kernel when the
context is split across programs); prefill keeps ``SdpaBackend``'s per-sequence path after the
same fused rotary + cache write. With this backend the Qwen backbones also use their fused
residual-add + RMSNorm and SiLU-gate kernels (``fused_ops``).
"""

from __future__ import annotations

import os

import torch

from omni_core.models import kernels
from omni_core.models.attention import AttentionMetadata, SdpaBackend, store_kv

BACKEND_ENV = "OMNI_ATTENTION_BACKEND"


class TritonPagedBackend:
    name = "triton"
    fuses_rotary = True
    fused_ops = True

    def __init__(self, num_splits: int | None = None):
        # num_splits: programs per (sequence, KV head) in decode; None picks from the grid size
        self.num_splits = num_splits
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
        if q.stride(-1) != 1:
            q = q.contiguous()
        return kernels.paged_decode_attention(q, k_cache, v_cache, meta.block_tables, meta.context_lens, meta.block_size, scale, self.num_splits)


def resolve_attention_backend(choice, device: torch.device):
    """The backend an engine uses: an object is used as is; ``"sdpa"`` or ``"triton"`` by name;
    None picks ``$OMNI_ATTENTION_BACKEND`` if set, else ``triton`` on CUDA when triton imports and
    ``sdpa`` otherwise."""
    if choice is not None and not isinstance(choice, str):
        return choice
    device = torch.device(device)
    name = choice or os.environ.get(BACKEND_ENV) or ("triton" if device.type == "cuda" and kernels.triton_available() else "sdpa")
    if name == "sdpa":
        return SdpaBackend()
    if name == "triton":
        reason = kernels.triton_unavailable_reason()
        if reason is not None:
            raise ValueError(f"attention backend 'triton': {reason}")
        if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError(f"attention backend 'triton' needs a CUDA device, not {device.type!r} (or TRITON_INTERPRET=1)")
        return TritonPagedBackend()
    raise ValueError(f"unknown attention backend {name!r}: expected 'sdpa' or 'triton'")
