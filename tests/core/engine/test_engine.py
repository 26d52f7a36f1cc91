"""AREngine end to end on a tiny Qwen2: inputs, outputs, limits and bad input."""

import pytest
import torch
from omni_core.scheduler import AREngine, EngineConfig, EngineRequest, SamplingParams

from .conftest import VOCAB, ShiftedLM

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def engine_for(model, **kw):
    return AREngine(model, EngineConfig(block_size=4, num_kv_blocks=kw.pop("num_kv_blocks", 256), **kw))


def run_all(engine):
    outs = {}
    while engine.has_unfinished():
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    return outs


def test_embedding_prompt_equals_token_prompt(tiny_model):
    prompt = [5, 17, 99, 3, 42, 8]
    by_ids = engine_for(tiny_model).generate([prompt], GREEDY)[0].token_ids
    engine = engine_for(tiny_model)
    with torch.no_grad():
        embeds = tiny_model.embed(torch.tensor(prompt))
    engine.add_request(EngineRequest("e", prompt_embeds=embeds, params=GREEDY))
    by_embeds = [t for o in run_all(engine)["e"] for t in o.new_token_ids]
    assert by_embeds == by_ids


def test_prefix_cache_keeps_apart_requests_whose_extras_change_their_kv(tiny_model):
    # the same ids, but the model adds each request's shift to its inputs: a block computed for
    # one request is not the other's, so without a prefix key saying what the extras change,
    # such requests are not prefix-cached (two full blocks here would be)
    model = ShiftedLM(tiny_model)
    prompt = [5, 17, 99, 3, 42, 8, 1, 2, 9]
    shifts = {"up": torch.full((1, 64), 0.5), "down": torch.full((1, 64), -0.5)}

    def tokens(engine, rid, shift, **key):
        engine.add_request(EngineRequest(rid, prompt_token_ids=prompt, params=GREEDY, extras={"shift": shifts[shift]}, **key))
        return [t for o in run_all(engine)[rid] for t in o.new_token_ids]

    alone = {shift: tokens(engine_for(model), "x", shift) for shift in shifts}
    assert alone["up"] != alone["down"]
    engine = engine_for(model)
    assert tokens(engine, "a", "up") == alone["up"] and tokens(engine, "b", "down") == alone["down"]
    assert engine.stats()["prefix_cache_hit_tokens"] == 0
    # a prefix key names what the extras change: equal keys share cached blocks, others do not
    engine = engine_for(model)
    assert tokens(engine, "a", "up", prefix_key="up") == alone["up"]
    assert tokens(engine, "b", "down", prefix_key="down") == alone["down"]
    assert engine.stats()["prefix_cache_hit_tokens"] == 0
    assert tokens(engine, "c", "up", prefix_key="up") == alone["up"]
    assert engine.stats()["prefix_cache_hit_tokens"] == 8


def test_hidden_states_match_transformers(tiny_checkpoint, tiny_model):
    hf, _ = tiny_checkpoint
    prompt = [7, 1, 64, 30, 2]
    engine = engine_for(tiny_model, max_num_batched_tokens=3)  # chunked prefill: 3 + 2 tokens
    engine.add_request(EngineRequest("h", prompt_token_ids=prompt, params=GREEDY, hidden_layers=(0, 1, 2)))
    outs = run_all(engine)["h"]
    tokens = [t for o in outs for t in o.new_token_ids]
    full = torch.tensor([prompt + tokens[:-1]])  # the last token is never fed back
    with torch.no_grad():
        ref = hf(full, output_hidden_states=True).hidden_states
    for layer in (0, 1, 2):
        ours = torch.cat([o.step_outputs["hidden_states"][layer] for o in outs])
        torch.testing.assert_close(ours, ref[layer][0], rtol=1e-4, atol=1e-4)


def test_stop_ids_min_tokens_and_max_tokens(tiny_model):
    prompt = [11, 12, 13]
    free = engine_for(tiny_model).generate([prompt], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    stop = free.token_ids[3]
    first = free.token_ids.index(stop)
    out = engine_for(tiny_model).generate([prompt], SamplingParams(temperature=0, max_tokens=12, stop_token_ids=[stop]))[0]
    assert out.token_ids == free.token_ids[: first + 1] and out.finish_reason == "stop"
    # before min_tokens the stop token is masked out, so greedy takes the runner-up
    late = engine_for(tiny_model).generate([prompt], SamplingParams(temperature=0, max_tokens=12, min_tokens=first + 2, stop_token_ids=[stop]))[0]
    assert stop not in late.token_ids[: first + 1]
    assert len(late.token_ids) >= first + 2
    assert free.finish_reason == "length" and len(free.token_ids) == 12


def test_eos_from_generation_config_stops(tiny_checkpoint):
    _, path = tiny_checkpoint
    engine = AREngine.from_pretrained(path, block_size=4, num_kv_blocks=64)
    free = engine.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0].token_ids
    engine.eos_token_ids = (free[2],)
    out = engine.generate([[3, 4, 5]], SamplingParams(temperature=0, max_tokens=10))[0]
    assert out.token_ids == free[: free.index(free[2]) + 1] and out.finish_reason == "stop"


@pytest.mark.parametrize(
    "request_kwargs, message",
    [
        (dict(prompt_token_ids=[1, VOCAB]), "vocab"),
        (dict(prompt_token_ids=[1] * 60, params=SamplingParams(max_tokens=10)), "max_model_len"),
        (dict(prompt_token_ids=[1], prompt_embeds=torch.zeros(1, 64)), "exactly one"),
        (dict(prompt_embeds=torch.zeros(3, 65)), "width"),
        (dict(prompt_token_ids=[]), "at least one"),
        (dict(prompt_token_ids=[1], hidden_layers=(3,)), "hidden_layers"),
    ],
)
def test_bad_requests_are_rejected_and_change_nothing(tiny_model, request_kwargs, message):
    engine = engine_for(tiny_model, num_kv_blocks=16)  # max_model_len 64
    engine.add_request(EngineRequest("ok", prompt_token_ids=[1, 2], params=GREEDY))
    before = engine.stats()
    with pytest.raises(ValueError, match=message):
        engine.add_request(EngineRequest("bad", **request_kwargs))
    assert engine.stats() == before and "bad" not in engine.requests
    with pytest.raises(ValueError, match="already"):
        engine.add_request(EngineRequest("ok", prompt_token_ids=[3], params=GREEDY))
    assert len(run_all(engine)["ok"]) == GREEDY.max_tokens


def test_abort_frees_blocks_at_once(tiny_model):
    engine = engine_for(tiny_model, num_kv_blocks=64)
    for i in range(3):
        engine.add_request(EngineRequest(f"r{i}", prompt_token_ids=list(range(1, 10 + i)), params=SamplingParams(max_tokens=30, seed=i)))
    engine.step()
    engine.step()
    used = engine.stats()["kv_blocks_total"] - engine.stats()["kv_blocks_free"]
    assert used > 0
    assert engine.abort("r1") and not engine.abort("r1") and not engine.abort("nope")
    assert engine.stats()["kv_blocks_free"] > engine.stats()["kv_blocks_total"] - used
    engine.abort("r0")
    engine.abort("r2")
    assert engine.stats()["kv_blocks_free"] == engine.stats()["kv_blocks_total"]
    assert not engine.has_unfinished() and engine.step() == []


def test_chunked_prefill_budget_and_max_num_seqs(tiny_model):
    seen = {"prefill_tokens": [], "decode_batch": []}

    class Watch:
        def before_prefill(self, batch):
            seen["prefill_tokens"].append(sum(batch.query_lens))

        def before_decode(self, batch):
            seen["decode_batch"].append(len(batch.request_ids))

    prompts = [list(range(1, 1 + n)) for n in (30, 5, 21, 9, 14)]
    plain = engine_for(tiny_model).generate(prompts, GREEDY)
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=256, max_num_batched_tokens=8, max_num_seqs=2, enable_prefix_caching=False), hooks=Watch())
    chunked = engine.generate(prompts, GREEDY)
    assert [o.token_ids for o in chunked] == [o.token_ids for o in plain]
    assert max(seen["prefill_tokens"]) <= 8 and max(seen["decode_batch"]) <= 2
    assert sum(seen["prefill_tokens"]) == sum(len(p) for p in prompts)


def test_kv_budget_in_bytes_sizes_the_cache(tiny_model):
    spec = tiny_model.kv_cache_spec
    per_block = 2 * spec.num_layers * 4 * spec.num_kv_heads * spec.head_dim * 4  # float32
    engine = AREngine(tiny_model, EngineConfig(block_size=4, kv_cache_bytes=10 * per_block + 5))
    assert engine.stats()["kv_blocks_total"] == 10 and engine.max_model_len == 40


def test_padded_batch_attention_path_gives_the_same_tokens(tiny_model):
    """The padded-batch SDPA path (what CUDA decode graphs run) against the per-sequence one,
    through chunked prefill, prefix hits and decode."""
    from omni_core.models import SdpaBackend

    g = torch.Generator().manual_seed(4)
    shared = torch.randint(0, VOCAB, (12,), generator=g).tolist()
    prompts = [shared + torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in (1, 7, 20, 3)]
    outs = {}
    for per_sequence in (True, False):
        engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=128, max_num_batched_tokens=16, attention_backend=SdpaBackend(per_sequence=per_sequence)))
        engine.generate(prompts[:1], GREEDY)  # leaves the shared prefix in the cache
        outs[per_sequence] = [o.token_ids for o in engine.generate(prompts, GREEDY)]
        assert engine.stats()["prefix_cache_hit_tokens"] > 0
    assert outs[True] == outs[False]
