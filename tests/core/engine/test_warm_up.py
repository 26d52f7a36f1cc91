"""The start-up prefill warm-up (run on CUDA before any request) leaves no trace: requests after
it get the tokens they get without it, with the prefix cache on, and every KV block is free."""

import torch
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
PROMPTS = [[5, 17, 99, 3, 42, 8, 1, 2, 9], [5, 17, 99, 3, 42, 8, 1, 2, 11, 4], [7] * 30]


def test_prefill_warm_up_changes_no_request(tiny_model):
    config = dict(block_size=4, num_kv_blocks=64, max_num_batched_tokens=256, enable_prefix_caching=True)
    plain = AREngine(tiny_model, EngineConfig(**config))
    warmed = AREngine(tiny_model, EngineConfig(**config))
    before = warmed.runner.kv_cache.clone()
    warmed.runner.warm_up_prefill(256)
    assert not torch.equal(warmed.runner.kv_cache, before)  # the passes ran and wrote KV
    assert warmed.block_manager.num_free_blocks == 64
    expected = [out.token_ids for out in plain.generate(PROMPTS, GREEDY)]
    assert [out.token_ids for out in warmed.generate(PROMPTS, GREEDY)] == expected
