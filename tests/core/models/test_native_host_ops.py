"""The host kernels for a decoder layer's element-wise steps against the torch ops they replace,
and where the layers take them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omni_core.models import native
from omni_core.models.attention import store_kv
from omni_core.models.layers import GatedMLP, RMSNorm, apply_rotary
from omni_core.models.native import host_ops

pytestmark = pytest.mark.skipif(native.load("host_ops") is None, reason="no C compiler on this machine")


@pytest.mark.parametrize(("rows", "hidden"), [(1, 256), (5, 96), (600, 33)])
@pytest.mark.parametrize("with_residual", [False, True])
def test_add_rms_norm_matches_torch(rows, hidden, with_residual):
    g = torch.Generator().manual_seed(rows)
    x, residual = torch.randn(rows, hidden, generator=g) * 3, torch.randn(rows, hidden, generator=g)
    weight = torch.randn(hidden, generator=g)
    if with_residual:
        out, total = host_ops.add_rms_norm(x, weight, 1e-6, residual)
        assert torch.equal(total, x + residual)  # one rounding, as torch's add
        source = x + residual
    else:
        out, source = host_ops.add_rms_norm(x, weight, 1e-6), x
    torch.testing.assert_close(out, weight * F.rms_norm(source, (hidden,), eps=1e-6), rtol=2e-6, atol=2e-6)


def test_silu_mul_matches_torch_over_the_whole_range():
    g = torch.Generator().manual_seed(0)
    gate = torch.cat([torch.randn(7, 64, generator=g) * 4, torch.linspace(-120, 120, 64)[None]])
    up = torch.randn(8, 64, generator=g)
    got = host_ops.silu_mul(torch.cat([gate, up], dim=-1))
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=2e-6, atol=1e-6)
    assert torch.isfinite(got).all()


@pytest.mark.parametrize(("tokens", "heads", "kv_heads", "dim"), [(1, 8, 2, 32), (37, 14, 2, 64), (5, 4, 4, 16)])
def test_rotary_store_is_bit_for_bit_the_torch_ops(tokens, heads, kv_heads, dim):
    """q/k/v as column slices of one projection output, as the layers hand them over."""
    g = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=g)
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.view(tokens, heads, dim), k.view(tokens, kv_heads, dim), v.view(tokens, kv_heads, dim)
    angles = torch.rand(tokens, 1, dim // 2, generator=g) * 50
    rope = (torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin())
    slots = torch.randperm(tokens + 9, generator=g)[:tokens]
    caches = [torch.zeros(tokens + 9, kv_heads, dim) for _ in range(4)]
    assert host_ops.takes_rotary(q, k, v, rope, caches[0], caches[1])
    assert not host_ops.takes_rotary(q, k, v, tuple(t.double() for t in rope), caches[0], caches[1])  # a table in another dtype: torch ops
    q_ours, k_ours = host_ops.rotary_store(q, k, v, rope, slots, caches[0], caches[1])
    q_ref, k_ref = apply_rotary(q, k, rope)
    store_kv(k_ref, v, caches[2], caches[3], slots)
    assert torch.equal(q_ours, q_ref) and torch.equal(k_ours, k_ref)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_layers_take_the_host_kernels_in_float32_for_small_steps_or_few_threads(monkeypatch):
    """Below torch's parallel grain at any thread count; larger tensors only with few threads
    (torch's ops then run on several); never in another dtype."""
    taken = []
    real = host_ops.add_rms_norm
    monkeypatch.setattr(host_ops, "add_rms_norm", lambda *a, **k: taken.append((a[0].shape[0], a[0].dtype)) or real(*a, **k))
    small, large = torch.randn(3, 16), torch.randn(host_ops.PARALLEL_GRAIN // 16 + 1, 16)
    threads = torch.get_num_threads()
    try:
        for n in (1, native.MAX_INTRA_OP_THREADS + 1):
            torch.set_num_threads(n)
            RMSNorm(16)(small)
            RMSNorm(16)(large)
        torch.set_num_threads(1)
        RMSNorm(16).to(torch.bfloat16)(small.bfloat16())
    finally:
        torch.set_num_threads(threads)
    assert taken == [(3, torch.float32), (large.shape[0], torch.float32), (3, torch.float32)]


def test_gated_mlp_on_the_host_kernel_matches_torch():
    mlp = GatedMLP(16, 32)
    x = torch.randn(4, 16)
    gate, up = mlp.gate_up_proj(x).chunk(2, dim=-1)
    torch.testing.assert_close(mlp(x), mlp.down_proj(F.silu(gate) * up), rtol=1e-5, atol=1e-6)
