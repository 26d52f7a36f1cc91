"""The shared rotary embedding equals transformers' Qwen2 rotation bit for bit (greedy parity
needs the same rounding, not just closeness)."""

import pytest
import torch
from omni_core.models.layers import RotaryEmbedding, apply_rotary
from transformers.models.qwen2.modeling_qwen2 import apply_rotary_pos_emb


@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), [(1, 8, 2, 32), (20, 4, 4, 16), (300, 14, 2, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("packed", [True, False])
def test_apply_rotary_equals_transformers(tokens, heads, kv_heads, dim, dtype, packed):
    g = torch.Generator().manual_seed(tokens)
    # packed: q and k as Qwen2 makes them, views into one fused projection output; else separate
    # tensors, as after Qwen3's per-head norms
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g).to(dtype)
    q = qkv[:, : heads * dim].view(tokens, heads, dim)
    k = qkv[:, heads * dim : (heads + kv_heads) * dim].view(tokens, kv_heads, dim)
    if not packed:
        q, k = q.clone(), k.clone()
    before = qkv.clone()
    positions = torch.randint(0, 4096, (tokens,), generator=g)
    cos, sin = RotaryEmbedding(dim, 4096, 1e6).table(positions, dtype)  # [T, 1, d]
    got_q, got_k = apply_rotary(q, k, (cos, sin))
    # transformers' layout: [batch, heads, T, d] with cos/sin [batch, T, d]
    ref_q, ref_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None, :, 0], sin[None, :, 0])
    assert torch.equal(got_q, ref_q[0].transpose(0, 1))
    assert torch.equal(got_k, ref_k[0].transpose(0, 1))
    assert torch.equal(qkv, before)  # the inputs are left as they were
