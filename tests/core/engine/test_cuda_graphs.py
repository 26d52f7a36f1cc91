"""CUDA-graph decode gives the same tokens as eager decode (needs a GPU)."""

import pytest
import torch
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_graph_decode_matches_eager(tiny_checkpoint):
    from omni_core.models import load_causal_lm

    model = load_causal_lm(tiny_checkpoint[1], device="cuda", dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (3, 17, 40, 5, 9)]
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    eager = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=64, cuda_graphs=False), device="cuda").generate(prompts, params)
    graphed_engine = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=64, cuda_graph_sizes=(1, 2, 4, 8)), device="cuda")
    assert sorted({size for size, _ in graphed_engine.runner.graphs}) == [1, 2, 4, 8]
    graphed = graphed_engine.generate(prompts, params)
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=16, seed=5, ignore_eos=True)
    a = graphed_engine.generate(prompts[:3], sampled)
    b = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=64, cuda_graphs=False), device="cuda").generate(prompts[:3], sampled)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]


class ScaledDecodeEmbeddings:
    """A ``before_decode`` hook that changes the step's input embeddings (as TTS talkers do)."""

    def before_decode(self, batch):
        batch.input_embeds.neg_()


def test_graph_decode_with_an_embedding_hook_matches_eager(tiny_checkpoint):
    # the hook changes the graph's input embeddings after they were looked up
    from omni_core.models import load_causal_lm

    model = load_causal_lm(tiny_checkpoint[1], device="cuda", dtype=torch.float32)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (4, 30)]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    config = dict(block_size=16, num_kv_blocks=64, cuda_graph_sizes=(1, 2))
    eager = AREngine(model, EngineConfig(**config, cuda_graphs=False), hooks=ScaledDecodeEmbeddings(), device="cuda").generate(prompts, params)
    engine = AREngine(model, EngineConfig(**config), hooks=ScaledDecodeEmbeddings(), device="cuda")
    assert engine.runner.graphs
    graphed = engine.generate(prompts, params)
    assert [o.token_ids for o in graphed] == [o.token_ids for o in eager]
    plain = AREngine(model, EngineConfig(**config), device="cuda").generate(prompts, params)
    assert [o.token_ids for o in plain] != [o.token_ids for o in eager]  # the hook did change the run


def test_overlapped_graph_decode_matches_step_by_step(tiny_checkpoint):
    # graph replays launched before the previous step's tokens are read: same tokens, no block left
    from omni_core.models import load_causal_lm

    from .test_overlap_decode import add_all, mixed_params, run_all

    model = load_causal_lm(tiny_checkpoint[1], device="cuda", dtype=torch.float32)
    free = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=64, overlap_decode=False), device="cuda")
    stop = free.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True))[0].token_ids[4]
    results = {}
    for overlap in (False, True):
        engine = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=64, cuda_graph_sizes=(1, 2, 4, 8), overlap_decode=overlap), device="cuda")
        assert engine.runner.graphs and engine.overlap_decode == overlap
        add_all(engine, mixed_params(stop))
        results[overlap] = run_all(engine)
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert results[True] == results[False]


class RecentTokensSampler:
    """A ``sample`` hook that reads only recent tokens (it may run ahead), then takes the argmax."""

    samples_ahead = True

    def sample(self, batch, logits):
        batch.recent_tokens(2)
        return logits.argmax(dim=-1)


def test_greedy_steps_ahead_take_their_ids_from_the_previous_replay(tiny_checkpoint):
    # the graph's argmax also writes the next replay's input ids and the tokens into pinned host
    # memory: a greedy step launched ahead of the same graph copies nothing either way, and gives
    # the step-by-step tokens
    from omni_core.models import load_causal_lm

    model = load_causal_lm(tiny_checkpoint[1], device="cuda", dtype=torch.float32)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (6, 21)]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    runs = {}
    for overlap in (False, True):
        engine = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=64, cuda_graph_sizes=(1, 2), overlap_decode=overlap), device="cuda")
        runs[overlap] = [engine.generate([p], params)[0].token_ids for p in prompts] + [o.token_ids for o in engine.generate(prompts, params)]
        assert engine.runner.argmax_feeds_ids and (engine.runner.ids_reused > 0) == overlap
        assert engine.runner.tokens_written_to_host > 0  # tokens read where the argmax stored them, step by step too
    assert runs[True] == runs[False]
    hooked = AREngine(model, EngineConfig(block_size=16, num_kv_blocks=64, cuda_graph_sizes=(1, 2), overlap_decode=True), hooks=RecentTokensSampler(), device="cuda")
    assert hooked.overlap_decode and not hooked.runner.argmax_feeds_ids  # the hook sees the step's own input ids
    assert [o.token_ids for o in hooked.generate(prompts, params)] == runs[True][2:]


def test_argmax_stores_into_the_chosen_row_of_pinned_host_memory():
    from omni_core.models import kernels

    logits = torch.randn(3, 500, device="cuda")
    host = torch.full((2, 3), -1, dtype=torch.int64, pin_memory=True)
    for turn in (1, 0):
        got = kernels.argmax(logits, host_out=host, turn=torch.tensor([turn], device="cuda"))
        torch.cuda.synchronize()
        assert torch.equal(host[turn], got.cpu()) and torch.equal(got, logits.argmax(dim=-1))
    with pytest.raises(ValueError, match="pinned"):
        kernels.argmax(logits, host_out=torch.zeros(2, 3, dtype=torch.int64), turn=torch.tensor([0], device="cuda"))
