"""Decode attention grouped by context length (the CPU path for caches the host kernel does not
take, or without it) against the per-sequence path."""

import pytest
import torch
from omni_core.models import SdpaBackend
from omni_core.models.attention import AttentionMetadata
from omni_core.models.grouped_decode import plan_decode_groups
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

from tests.helpers.paged import scattered_cache

from .conftest import VOCAB

BLOCK = 4


def _decode_step(context_lens, heads, kv_heads, dim=8, seed=0):
    """A paged cache with shuffled blocks and one decode query per sequence."""
    g = torch.Generator().manual_seed(seed)
    block_tables, k_cache, v_cache = scattered_cache(context_lens, kv_heads, dim, BLOCK, g)
    ctx = torch.tensor(context_lens)
    last = ctx - 1
    meta = AttentionMetadata(block_tables[torch.arange(len(ctx)), last // BLOCK] * BLOCK + last % BLOCK, block_tables, ctx, torch.ones_like(ctx), 1, BLOCK)
    meta.host_query_lens, meta.host_context_lens = [1] * len(ctx), list(context_lens)
    q = torch.randn(len(ctx), heads, dim, generator=g)
    k = torch.randn(len(ctx), kv_heads, dim, generator=g)
    v = torch.randn(len(ctx), kv_heads, dim, generator=g)
    return q, k, v, k_cache, v_cache, meta


def _attend(backend, step):
    q, k, v, k_cache, v_cache, meta = step
    meta.cache = {}
    backend.prepare(meta)
    return backend.forward(q, k, v, k_cache.clone(), v_cache.clone(), meta, q.shape[-1] ** -0.5), meta


@pytest.mark.parametrize(
    ("context_lens", "heads", "kv_heads"),
    [
        ([5], 4, 2),  # one sequence, a padded last block
        ([8, 4, 12], 4, 4),  # whole blocks only: no mask, no grouped-query folding
        ([2, 3, 7, 9, 9], 8, 2),  # sorted already: no reordering
        ([1, 37, 2, 16, 9, 30, 3, 22, 5, 41, 17, 8], 6, 2),  # two groups, mixed lengths, out of order
    ],
)
def test_grouped_decode_equals_per_sequence(context_lens, heads, kv_heads):
    step = _decode_step(context_lens, heads, kv_heads)
    expected, _ = _attend(SdpaBackend(per_sequence=True), step)
    got, meta = _attend(SdpaBackend(native=False), step)
    assert "decode_plan" in meta.cache
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_plan_groups_by_length_and_masks_only_padding():
    lens = [9, 2, 30, 3, 16]
    tables = torch.arange(5 * 8).view(5, 8)
    plan = plan_decode_groups(tables, lens, BLOCK, group_size=2)
    assert plan.order.tolist() == [1, 3, 0, 4, 2]  # sorted by context length
    assert torch.equal(plan.order[plan.inverse], torch.arange(5))
    assert [(g.start, g.size) for g in plan.groups] == [(0, 2), (2, 2), (4, 1)]
    assert [g.length for g in plan.groups] == [4, 16, 32]
    assert [g.longest for g in plan.groups] == [3, 16, 30]
    assert plan.groups[0].blocks.tolist() == [8, 24]  # block 0 of rows 1 and 3
    assert plan.groups[1].blocks.tolist() == [0, 1, 2, 3, 32, 33, 34, 35]  # the group's longest (16 tokens) is 4 blocks
    assert [g.padded for g in plan.groups] == [True, True, False]  # one sequence: its keys are cut to its length
    assert plan.padding[0, :3].tolist() == [False, False, True]  # the 2-token row of the first group
    assert plan_decode_groups(tables, sorted(lens), BLOCK, group_size=2).order is None  # already in order: no reordering


def test_layers_reuse_the_steps_views_and_masks():
    """The first layer makes the gather targets and masks; later layers of the step reuse them."""
    step = _decode_step([1, 37, 2, 16, 9, 30, 3, 22], 4, 2)
    q, k, v, k_cache, v_cache, meta = step
    backend = SdpaBackend(native=False)
    backend.prepare(meta)
    plan = meta.cache["decode_plan"]
    first = backend.forward(q, k, v, k_cache, v_cache, meta, 0.5)
    views = [t.data_ptr() for entry in plan.steps for t in entry if t is not None]
    masks = [entry[4] for entry in plan.steps]
    assert all(m is None or (m.dtype == k_cache.dtype and m.shape[:3] == (g.size, 1, 1)) for g, m in zip(plan.groups, masks, strict=True))
    again = backend.forward(q, k, v, k_cache, v_cache, meta, 0.5)
    assert [t.data_ptr() for entry in plan.steps for t in entry if t is not None] == views
    torch.testing.assert_close(again, first)


def test_engine_tokens_are_the_same_on_every_decode_path(tiny_model):
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (3, 17, 1, 9, 30, 6, 12, 25, 2, 11)]
    params = [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (12, 5, 20, 9, 3, 16, 7, 11, 14, 6)]
    outs = {}
    backends = {"default": SdpaBackend(), "grouped": SdpaBackend(native=False), "per sequence": SdpaBackend(per_sequence=True)}
    for name, backend in backends.items():
        engine = AREngine(tiny_model, EngineConfig(block_size=BLOCK, num_kv_blocks=128, max_num_seqs=16, attention_backend=backend))
        outs[name] = [o.token_ids for o in engine.generate(prompts, params)]
        assert engine.block_manager.num_free_blocks == 128
    assert outs["default"] == outs["grouped"] == outs["per sequence"]
    assert [len(t) for t in outs["default"]] == [p.max_tokens for p in params]
