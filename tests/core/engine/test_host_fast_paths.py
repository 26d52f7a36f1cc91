"""Host shortcuts of a step give what the general code gives: sampling tensors reused across
decode steps, the all-greedy sampler, and clearing the prefix cache."""

import torch
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams
from omni_core.scheduler.sampler import Sampler, build_sampling_tensors
from omni_core.scheduler.sequence import Sequence

from .conftest import VOCAB


def _seqs():
    params = [
        SamplingParams(temperature=0.8, top_k=5, seed=1),
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.2, top_p=0.7, min_p=0.05, seed=2, repetition_penalty=1.3),
        SamplingParams(temperature=1.0, seed=3, min_tokens=3, stop_token_ids=[4]),
        SamplingParams(temperature=0.5, seed=4, min_tokens=5, stop_token_ids=[6]),
    ]
    return [Sequence(f"r{i}", [1, 2, 3 + i], p) for i, p in enumerate(params)]


def test_reused_sampling_tensors_equal_fresh_ones_step_after_step():
    seqs = _seqs()
    logits = torch.randn(len(seqs), 16, generator=torch.Generator().manual_seed(0))
    sampler = Sampler()
    previous = build_sampling_tensors(seqs, 16, "cpu")
    for step in range(5):
        for s in seqs:
            s.append_token(step + 4)  # the masks (seen tokens, banned stop ids) change as tokens come
        fresh = build_sampling_tensors(seqs, 16, "cpu")
        reused = build_sampling_tensors(seqs, 16, "cpu", reuse=previous)
        for name in ("temperature", "top_k", "top_p", "min_p", "seeds", "steps", "penalty", "seen_tokens"):
            assert torch.equal(getattr(fresh, name), getattr(reused, name)), name
        assert (fresh.banned is None) == (reused.banned is None) == (step >= 4)  # two rows leave min_tokens at 2 and 4
        assert fresh.banned is None or torch.equal(fresh.banned, reused.banned)
        assert torch.equal(sampler(logits, fresh), sampler(logits, reused))
        previous = reused


def test_all_greedy_batches_skip_the_parameter_tensors():
    seqs = [Sequence(f"g{i}", [1, 2], SamplingParams(temperature=0)) for i in range(3)]
    t = build_sampling_tensors(seqs, 16, "cpu")
    assert t.all_greedy and t.temperature is None and t.steps is None
    logits = torch.randn(3, 16, dtype=torch.bfloat16)
    assert torch.equal(Sampler()(logits, t), logits.float().argmax(-1))
    seqs.append(Sequence("p", [1, 2], SamplingParams(temperature=0, repetition_penalty=2.0)))
    t = build_sampling_tensors(seqs, 16, "cpu")  # greedy, but the penalty needs the full path
    assert t.all_greedy and t.penalty is not None
    assert Sampler()(torch.randn(4, 16), t).shape == (4,)


def test_reset_prefix_cache_forgets_free_blocks_only(tiny_model):
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64))
    prompt = torch.randint(0, VOCAB, (17,), generator=torch.Generator().manual_seed(1)).tolist()
    greedy = SamplingParams(temperature=0, max_tokens=4)
    first = engine.generate([prompt], greedy)[0].token_ids
    assert engine.generate([prompt], greedy)[0].token_ids == first
    hits = engine.stats()["prefix_cache_hit_tokens"]
    assert hits == 16
    assert engine.reset_prefix_cache() > 0
    assert engine.generate([prompt], greedy)[0].token_ids == first
    assert engine.stats()["prefix_cache_hit_tokens"] == hits  # recomputed: no new hits
    assert engine.block_manager.num_free_blocks == 64
