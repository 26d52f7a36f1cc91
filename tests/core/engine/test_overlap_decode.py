"""Overlapped decode (``EngineConfig.overlap_decode``): each decode step is launched before the
previous one's tokens reach the host. Whatever the calls, the engine must produce exactly what
the step-by-step engine produces, and leave no KV block behind."""

import pytest
import torch
from omni_core.scheduler import AREngine, EngineConfig, EngineRequest, SamplingParams
from omni_core.scheduler.hooks import ARHooks

from .conftest import VOCAB


def engine_for(model, overlap, **kw):
    return AREngine(model, EngineConfig(block_size=4, num_kv_blocks=kw.pop("num_kv_blocks", 256), overlap_decode=overlap, **kw))


def prompts(n=8):
    return [[(7 * i + j) % (VOCAB - 1) + 1 for j in range(3 + 5 * i)] for i in range(n)]


def mixed_params(stop):
    """Greedy and sampled requests; lengths, stop tokens and min_tokens that end them at different steps."""
    return [
        SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=1, ignore_eos=True),
        SamplingParams(temperature=0, max_tokens=20, stop_token_ids=[stop]),
        SamplingParams(temperature=0.8, top_p=0.9, max_tokens=15, seed=3),
        SamplingParams(temperature=1.0, top_k=20, max_tokens=9, seed=4, stop_token_ids=[stop]),
        SamplingParams(temperature=0, max_tokens=16, min_tokens=6, stop_token_ids=[stop]),
        SamplingParams(temperature=0.7, min_p=0.05, max_tokens=2, seed=6),
        SamplingParams(temperature=0, max_tokens=18, ignore_eos=True),
    ]


def run_all(engine, events=None):
    """Steps until done; ``events`` {step number: callable(engine)} runs between steps.
    Returns {request id: (tokens, finish reason)} built from the step outputs."""
    outs, n = {}, 0
    while engine.has_unfinished() or (events and n <= max(events)):
        if events and n in events:
            events[n](engine)
        for out in engine.step():
            tokens, _ = outs.get(out.request_id, ([], None))
            outs[out.request_id] = (tokens + out.new_token_ids, out.finish_reason)
        n += 1
    return outs


def add_all(engine, params, offset=0):
    for i, (prompt, p) in enumerate(zip(prompts(len(params)), params, strict=True)):
        engine.add_request(EngineRequest(f"r{i + offset}", prompt_token_ids=prompt, params=p))


def stop_token(model):
    free = engine_for(model, False).generate([prompts(1)[0]], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0]
    return free.token_ids[4]


def assert_all_blocks_free(engine):
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert not engine.requests


@pytest.mark.parametrize("num_kv_blocks", [256, 24], ids=["roomy", "preempting"])
def test_overlapped_decode_gives_the_step_by_step_tokens(tiny_model, num_kv_blocks):
    params = mixed_params(stop_token(tiny_model))
    results = {}
    for overlap in (False, True):
        engine = engine_for(tiny_model, overlap, num_kv_blocks=num_kv_blocks, max_num_seqs=8)
        add_all(engine, params)
        results[overlap] = run_all(engine)
        assert_all_blocks_free(engine)
    assert results[True] == results[False]
    assert {reason for _, reason in results[True].values()} == {"length", "stop"}
    if num_kv_blocks == 24:
        assert engine.scheduler.num_preemptions > 0


def test_a_decode_step_stays_in_flight_between_calls(tiny_model):
    engine = engine_for(tiny_model, True)
    engine.add_request(EngineRequest("a", prompt_token_ids=[1, 2, 3], params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
    first = engine.step()  # prefill: no step is left in flight
    assert [o.new_token_ids for o in first] and engine.in_flight is None
    second = engine.step()  # decode: the next decode step is already launched
    assert len(second) == 1 and len(second[0].new_token_ids) == 1 and engine.in_flight is not None
    assert [s.request_id for s in engine.in_flight.seqs] == ["a"]
    tokens = first[0].new_token_ids + second[0].new_token_ids
    while engine.has_unfinished():
        tokens += [t for o in engine.step() for t in o.new_token_ids]
    ref = engine_for(tiny_model, False).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    assert tokens == ref.token_ids
    assert_all_blocks_free(engine)


def test_requests_added_and_aborted_while_a_step_is_in_flight(tiny_model):
    params = mixed_params(stop_token(tiny_model))

    def add_late(engine):
        engine.add_request(EngineRequest("late", prompt_token_ids=[5, 6, 7, 8, 9], params=SamplingParams(temperature=0.9, max_tokens=10, seed=11)))

    def abort_one(engine):
        assert engine.abort("r7")

    results = {}
    for overlap in (False, True):
        engine = engine_for(tiny_model, overlap, max_num_seqs=8)
        add_all(engine, params)
        results[overlap] = run_all(engine, {3: add_late, 6: abort_one})
        assert_all_blocks_free(engine)
    assert results[True] == results[False]
    assert "late" in results[True] and results[True]["r7"][1] is None


def test_sequences_that_need_their_tokens_on_the_host_run_step_by_step(tiny_model):
    penalised = SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.3, ignore_eos=True)
    engine = engine_for(tiny_model, True)
    engine.add_request(EngineRequest("p", prompt_token_ids=[1, 2, 3], params=penalised))
    outs = run_all(engine)
    ref = engine_for(tiny_model, False).generate([[1, 2, 3]], penalised)[0]
    assert outs["p"] == (ref.token_ids, "length")

    class PostDecode(ARHooks):
        def post_decode(self, batch, hidden, logits, token_ids):
            return None

    hooked = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64, overlap_decode=True), hooks=PostDecode())
    assert not hooked.overlap_decode and engine.overlap_decode
    assert not engine_for(tiny_model, None).overlap_decode  # CPU: off unless asked for


class NoRecentRepeat(ARHooks):
    """A family sampler that reads the tokens it just made (as CosyVoice3's RAS does): greedy,
    but none of the last three tokens again, and a nudge that depends on the token count."""

    samples_ahead = True

    def sample(self, batch, logits):
        scores = logits.float().clone()
        recent = batch.recent_tokens(3)
        rows = torch.arange(len(recent))[:, None].expand_as(recent)
        seen = recent >= 0
        scores[rows[seen], recent[seen]] = float("-inf")
        nudge = torch.tensor(batch.num_output_tokens) * 7 % logits.shape[-1]
        scores[torch.arange(len(recent)), nudge] += 1.0
        return scores.argmax(dim=-1)


def test_a_sampler_hook_that_reads_recent_tokens_overlaps_and_matches(tiny_model):
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in (14, 3, 20, 9)]
    results = {}
    for overlap in (False, True):
        engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64, overlap_decode=overlap), hooks=NoRecentRepeat())
        assert engine.overlap_decode == overlap
        add_all(engine, params)
        results[overlap] = run_all(engine)
        assert_all_blocks_free(engine)
    assert results[True] == results[False]
    for tokens, _ in results[True].values():  # the hook did run: no token repeats within three
        assert all(tokens[i] not in tokens[max(0, i - 3) : i] for i in range(len(tokens)))

    class HostSampler(NoRecentRepeat):
        samples_ahead = False

    assert not AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64, overlap_decode=True), hooks=HostSampler()).overlap_decode
