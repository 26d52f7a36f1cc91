"""Greedy outputs of our engine equal transformers' generate, token for token."""

import pytest
import torch
from omni_core.scheduler import AREngine, SamplingParams

NEW_TOKENS = 16


def prompts():
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(0, 256, (40,), generator=g).tolist()
    rand = lambda n: torch.randint(0, 256, (n,), generator=g).tolist()  # noqa: E731
    # different lengths; three share a 40-token prefix so the prefix cache has hits
    return [rand(3), rand(9), shared + rand(5), rand(17), shared + rand(11), rand(33), shared, rand(70)]


def reference(model, batch):
    outs = []
    for p in batch:
        ids = model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
        outs.append(ids[0, len(p) :].tolist())
    return outs


CONFIGS = {
    "prefix-cache": dict(block_size=8),
    "no-prefix-cache": dict(block_size=8, enable_prefix_caching=False),
    # 14 blocks of 8 tokens cannot hold 8 sequences: decode preempts; prefill is chunked at 24 tokens
    "preempt": dict(block_size=8, num_kv_blocks=14, max_num_batched_tokens=24),
}


@pytest.mark.parametrize("arch", ["Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"])
def test_greedy_matches_transformers(hf_checkpoints, arch):
    model, path = hf_checkpoints[arch]
    batch = prompts()
    expected = reference(model, batch)
    for name, overrides in CONFIGS.items():
        engine = AREngine.from_pretrained(path, **overrides)
        params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
        # the second round finds the first round's (freed) blocks in the prefix cache
        for round_ in range(2 if name == "prefix-cache" else 1):
            got = [o.token_ids for o in engine.generate(batch, params)]
            assert got == expected, f"{arch} with {name}, round {round_}"
        stats = engine.stats()
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"], "finished requests must free every block"
        if name == "prefix-cache":
            assert stats["prefix_cache_hit_tokens"] >= 3 * 40 - 24
        if name == "no-prefix-cache":
            assert stats["prefix_cache_hit_tokens"] == 0
        if name == "preempt":
            assert stats["preemptions"] > 0
