"""Several prompts' prefill attention in one varlen kernel: its packed key slots on any device, and
on a GPU its output against per-sequence SDPA over the same paged cache (fresh prompts, cached
prefixes, later chunks, grouped heads), and the backend choosing it for a step of several prompts."""

from __future__ import annotations

import pytest
import torch
from omni_core.models import SdpaBackend
from omni_core.models.attention import AttentionMetadata
from omni_core.models.kernels import varlen_prefill

from tests.helpers.paged import reference_attention, scattered_cache

CASES = [
    ([16, 37, 200, 5], [16, 37, 200, 5], 8, 2, 64, 16),  # fresh prompts
    ([100, 300, 64], [20, 1, 64], 8, 2, 128, 16),  # cached prefixes / a later chunk / one decode-like row
    ([90, 33], [90, 7], 14, 2, 64, 16),  # seven query heads a KV head
]


def _metadata(tables, context_lens, query_lens, block_size, device):
    return AttentionMetadata(
        slot_mapping=torch.zeros(sum(query_lens), dtype=torch.long, device=device),
        block_tables=tables.to(device),
        context_lens=torch.tensor(context_lens, device=device),
        query_lens=torch.tensor(query_lens, device=device),
        max_query_len=max(query_lens),
        block_size=block_size,
        host_query_lens=list(query_lens),
        host_context_lens=list(context_lens),
    )


def test_plan_packs_each_sequences_slots_in_order():
    g = torch.Generator().manual_seed(0)
    context_lens, query_lens, block_size = [5, 40, 17], [5, 3, 17], 8
    tables, _, _ = scattered_cache(context_lens, 2, 8, block_size, g)
    planned = varlen_prefill.plan(_metadata(tables, context_lens, query_lens, block_size, "cpu"))
    expected = torch.cat(
        [tables[b, torch.arange(n) // block_size] * block_size + torch.arange(n) % block_size for b, n in enumerate(context_lens)]
    )
    assert torch.equal(planned["slots"], expected)
    assert planned["cu_q"].tolist() == [0, 5, 8, 25] and planned["cu_k"].tolist() == [0, 5, 45, 62]
    assert (planned["max_q"], planned["max_k"]) == (17, 40)


def test_host_tensors_and_float32_are_not_taken():
    q = torch.zeros(4, 8, 64, dtype=torch.bfloat16)
    assert not varlen_prefill.supports(q, torch.zeros(16, 2, 64, dtype=torch.bfloat16))


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@pytest.mark.parametrize(("context_lens", "query_lens", "heads", "kv_heads", "dim", "block_size"), CASES)
def test_varlen_equals_sdpa_per_sequence(context_lens, query_lens, heads, kv_heads, dim, block_size):
    g = torch.Generator().manual_seed(1)
    tables, k_cache, v_cache = scattered_cache(context_lens, kv_heads, dim, block_size, g)
    q = torch.randn(sum(query_lens), heads, dim, generator=g)
    expected = reference_attention(q, k_cache, v_cache, tables, context_lens, query_lens, block_size, dim**-0.5)
    cuda = {"device": "cuda", "dtype": torch.bfloat16}
    q, k_cache, v_cache = q.to(**cuda), k_cache.to(**cuda), v_cache.to(**cuda)
    assert varlen_prefill.supports(q, k_cache)
    planned = varlen_prefill.plan(_metadata(tables, context_lens, query_lens, block_size, "cuda"))
    got = varlen_prefill.attend(q, k_cache, v_cache, planned, dim**-0.5)
    torch.testing.assert_close(got.float().cpu(), expected, rtol=2e-2, atol=2e-2)


@gpu
def test_backend_takes_varlen_for_several_prompts_and_matches_per_sequence():
    # every sequence has history, so the per-sequence path reads all its keys from the cache too
    context_lens, query_lens, heads, kv_heads, dim, block_size = [100, 300, 64], [20, 1, 63], 8, 2, 128, 16
    g = torch.Generator().manual_seed(2)
    tables, k_cache, v_cache = scattered_cache(context_lens, kv_heads, dim, block_size, g)
    q = torch.randn(sum(query_lens), heads, dim, generator=g)
    cuda = {"device": "cuda", "dtype": torch.bfloat16}
    q, k_cache, v_cache = q.to(**cuda), k_cache.to(**cuda), v_cache.to(**cuda)
    outs = []
    for backend in (SdpaBackend(), SdpaBackend(per_sequence=True)):
        meta = _metadata(tables, context_lens, query_lens, block_size, "cuda")
        backend.prepare(meta)
        assert ("varlen" in meta.cache) is (backend.per_sequence is None)
        outs.append(backend.attend(q, None, None, k_cache, v_cache, meta, dim**-0.5).float())
    torch.testing.assert_close(outs[0], outs[1], rtol=2e-2, atol=2e-2)
