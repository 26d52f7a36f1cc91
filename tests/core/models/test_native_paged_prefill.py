"""The host C kernel for paged causal prefill attention: against per-sequence SDPA (fresh prompts,
cached prefixes, later chunks), when the backend takes it, and where it gives way to SDPA."""

from __future__ import annotations

import pytest
import torch
from omni_core.models import SdpaBackend, native
from omni_core.models.attention import AttentionMetadata
from omni_core.models.native import paged_prefill

from tests.helpers.paged import reference_attention, scattered_cache

pytestmark = pytest.mark.skipif(native.load("paged_prefill") is None, reason="no C compiler on this machine")


def _paged_prefill(context_lens, query_lens, heads, kv_heads, dim, block_size, seed=0):
    """Scattered caches holding every position (new tokens included), and the new tokens' queries."""
    g = torch.Generator().manual_seed(seed)
    tables, k_cache, v_cache = scattered_cache(context_lens, kv_heads, dim, block_size, g)
    return torch.randn(sum(query_lens), heads, dim, generator=g), k_cache, v_cache, tables


def _run(q, k_cache, v_cache, tables, context_lens, query_lens, block_size, scale):
    return paged_prefill.paged_prefill_attention(
        q, k_cache, v_cache, tables, torch.tensor(context_lens), torch.tensor(query_lens), max(context_lens), block_size, scale
    )


@pytest.mark.parametrize(
    ("context_lens", "query_lens", "heads", "kv_heads", "dim", "block_size"),
    [
        ([1], [1], 2, 2, 32, 16),  # one token
        ([16, 37, 200, 5], [16, 37, 200, 5], 8, 2, 32, 16),  # fresh prompts: tiles, key chunks and tails
        ([100, 300, 64], [20, 1, 64], 8, 2, 32, 16),  # cached prefixes / earlier chunks, one decode-like row
        ([90, 33], [90, 7], 14, 2, 64, 16),  # seven query heads a KV head (Qwen2-0.5B's): rows across tokens
        ([70, 129], [70, 50], 4, 1, 128, 32),  # one KV head, larger blocks
        ([45, 19], [45, 19], 6, 3, 48, 4),  # a head size without a fixed-size copy, blocks smaller than a key chunk
    ],
)
def test_kernel_equals_sdpa_over_the_paged_cache(context_lens, query_lens, heads, kv_heads, dim, block_size):
    q, k_cache, v_cache, tables = _paged_prefill(context_lens, query_lens, heads, kv_heads, dim, block_size)
    got = _run(q, k_cache, v_cache, tables, context_lens, query_lens, block_size, dim**-0.5)
    torch.testing.assert_close(got, reference_attention(q, k_cache, v_cache, tables, context_lens, query_lens, block_size, dim**-0.5), rtol=1e-5, atol=1e-5)


def test_long_context_shrinks_tiles_to_the_scratch():
    """A context too long for a full tile's scores in the scratch: one token's rows a tile."""
    context_lens, query_lens = [paged_prefill.SCRATCH_FLOATS // 4 + 50], [40]
    q, k_cache, v_cache, tables = _paged_prefill(context_lens, query_lens, 8, 2, 32, 16)
    got = _run(q, k_cache, v_cache, tables, context_lens, query_lens, 16, 32**-0.5)
    torch.testing.assert_close(got, reference_attention(q, k_cache, v_cache, tables, context_lens, query_lens, 16, 32**-0.5), rtol=1e-5, atol=1e-5)


def test_large_scores_do_not_overflow():
    context_lens = query_lens = [80, 17]
    q, k_cache, v_cache, tables = _paged_prefill(context_lens, query_lens, 4, 2, 32, 16)
    q = q * 40
    got = _run(q, k_cache, v_cache, tables, context_lens, query_lens, 16, 1.0)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, reference_attention(q, k_cache, v_cache, tables, context_lens, query_lens, 16, 1.0), rtol=1e-4, atol=1e-4)


def test_shapes_it_does_not_take_raise():
    q, k_cache, v_cache, tables = _paged_prefill([10], [10], 4, 2, 20, 4)
    assert not paged_prefill.supports(q, k_cache, v_cache)
    with pytest.raises(ValueError, match="head size 20"):
        _run(q, k_cache, v_cache, tables, [10], [10], 4, 1.0)


def _prefill_meta(tables, context_lens, query_lens, block_size):
    ctx = torch.tensor(context_lens)
    positions = torch.cat([torch.arange(c - n, c) for c, n in zip(context_lens, query_lens, strict=True)])
    rows = torch.repeat_interleave(torch.arange(len(context_lens)), torch.tensor(query_lens))
    slots = tables[rows, positions // block_size] * block_size + positions % block_size
    meta = AttentionMetadata(slots, tables, ctx, torch.tensor(query_lens), max(query_lens), block_size)
    meta.host_query_lens, meta.host_context_lens = query_lens, context_lens
    return meta


def test_backend_prefills_float32_on_the_kernel_and_other_shapes_per_sequence():
    """The backend writes the new K/V and attends: the kernel for float32 head sizes it takes,
    per-sequence SDPA (with the fresh K/V or gathered history) otherwise; the same outputs."""
    context_lens, query_lens = [30, 12, 50], [30, 5, 9]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the kernel's setting (native.preferred)
    try:
        for dim, dtype, path in ((16, torch.float32, "native"), (20, torch.float32, "sdpa"), (16, torch.bfloat16, "sdpa")):
            _prefill_once(context_lens, query_lens, dim, dtype, path)
    finally:
        torch.set_num_threads(threads)


def _prefill_once(context_lens, query_lens, dim, dtype, path):
    q, k_cache, v_cache, tables = _paged_prefill(context_lens, query_lens, 4, 2, dim, 4)
    meta = _prefill_meta(tables, context_lens, query_lens, 4)
    k, v = k_cache[meta.slot_mapping].clone(), v_cache[meta.slot_mapping].clone()  # the step's new K/V, written again
    backend = SdpaBackend()
    backend.prepare(meta)
    assert "native_prefill" in meta.cache
    kc, vc = k_cache.to(dtype), v_cache.to(dtype)
    out = backend.forward(q.to(dtype), k.to(dtype), v.to(dtype), kc, vc, meta, dim**-0.5)
    assert ("seq_slots" in meta.cache) == (path == "sdpa")
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    expected = reference_attention(q.to(dtype).float(), kc.float(), vc.float(), tables, context_lens, query_lens, 4, dim**-0.5)
    torch.testing.assert_close(out.float(), expected, rtol=tol, atol=tol)


def test_backend_takes_the_kernel_with_few_intra_op_threads():
    context_lens = query_lens = [9, 30]
    _, _, _, tables = _paged_prefill(context_lens, query_lens, 4, 2, 16, 4)
    threads = torch.get_num_threads()
    chosen = {}
    try:
        for n in (1, native.MAX_INTRA_OP_THREADS, native.MAX_INTRA_OP_THREADS + 1):
            torch.set_num_threads(n)
            meta = _prefill_meta(tables, context_lens, query_lens, 4)
            SdpaBackend().prepare(meta)
            chosen[n] = "native_prefill" in meta.cache
    finally:
        torch.set_num_threads(threads)
    assert list(chosen.values()) == [True, True, False]
