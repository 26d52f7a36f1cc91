"""Random traffic on a tight KV cache: preemption, chunking, prefix hits and aborts leak nothing."""

import random

import torch
from omni_core.scheduler import AREngine, EngineConfig, EngineRequest, SamplingParams


def test_random_traffic_with_aborts_frees_every_block(tiny_model):
    rng = random.Random(7)
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=24, max_num_batched_tokens=20, max_num_seqs=6))
    shared = [rng.randrange(128) for _ in range(9)]
    expected_len, produced, finished, aborted = {}, {}, set(), set()
    next_id = 0
    for _ in range(400):
        if next_id < 40 and rng.random() < 0.4:
            rid = f"r{next_id}"
            next_id += 1
            n = rng.randint(1, 30)
            params = SamplingParams(temperature=rng.choice([0, 0.8]), top_k=rng.choice([0, 5]), max_tokens=rng.randint(1, 20), seed=next_id, ignore_eos=True)
            if rng.random() < 0.3:
                engine.add_request(EngineRequest(rid, prompt_embeds=torch.randn(n, 64), params=params))
            else:
                prompt = (shared if rng.random() < 0.5 else []) + [rng.randrange(128) for _ in range(n)]
                engine.add_request(EngineRequest(rid, prompt_token_ids=prompt, params=params))
            expected_len[rid] = params.max_tokens
        if engine.requests and rng.random() < 0.05:
            rid = rng.choice(sorted(engine.requests))
            assert engine.abort(rid)
            aborted.add(rid)
        for out in engine.step():
            produced[out.request_id] = produced.get(out.request_id, 0) + len(out.new_token_ids)
            if out.finished:
                finished.add(out.request_id)
        if next_id >= 40 and not engine.has_unfinished():
            break
    assert not engine.has_unfinished()
    assert engine.scheduler.num_preemptions > 0 and engine.stats()["prefix_cache_hit_tokens"] > 0
    assert finished | aborted == set(expected_len) and not finished & aborted
    for rid in finished:
        assert produced[rid] == expected_len[rid]
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    assert all(bm.blocks[block_id].hash == h for h, block_id in bm.hash_to_block.items())


def test_preemption_and_chunking_do_not_change_seeded_samples(tiny_model):
    rng = random.Random(3)
    prompts = [[rng.randrange(128) for _ in range(rng.randint(1, 30))] for _ in range(10)]
    params = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=rng.randint(5, 25), seed=i, ignore_eos=True) for i in range(10)]
    roomy = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=512)).generate(prompts, params)
    tight_engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=20, max_num_batched_tokens=12))
    tight = tight_engine.generate(prompts, params)
    assert tight_engine.scheduler.num_preemptions > 0
    assert [o.token_ids for o in tight] == [o.token_ids for o in roomy]
