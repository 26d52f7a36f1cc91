"""Prefill steps in graphs (scheduler/prefill_graphs.py) give the tokens eager prefill gives.

On the host the graphs' padded inputs, masks and scratch slot run through a stand-in that replays
the captured step eagerly into the same static tensors; on CUDA through real graphs.
"""

import pytest
import torch
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams
from omni_core.scheduler.prefill_graphs import PrefillGraphs

GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


class EagerGraph:
    """A graph's stand-in on the host: ``replay()`` runs the captured step again and writes its
    results into the tensors the capture returned, as a graph's replay does."""

    def __init__(self, step, outputs):
        self.step, self.outputs = step, outputs

    def replay(self):
        for out, new in zip(self.outputs, self.step(), strict=True):
            out.copy_(new)

    def pool(self):
        return None


def capture_eagerly(step, device, pool):
    outputs = step()
    return EagerGraph(step, outputs), outputs


def prompts_one_by_one(engine, prompts, params=GREEDY):
    """Each prompt alone (a prefill step of one sequence), in order, on one engine."""
    return [engine.generate([p], params)[0].token_ids for p in prompts]


def prompts():
    g = torch.Generator().manual_seed(3)
    shared = torch.randint(0, 128, (35,), generator=g).tolist()
    return [torch.randint(0, 128, (n,), generator=g).tolist() for n in (3, 17, 40)] + [
        shared + [5, 6],
        shared + [7],  # its first two blocks come from the prefix cache: the prefill continues them
        torch.randint(0, 128, (150,), generator=g).tolist(),  # wider than every graph: eager
    ]


def test_prefill_in_graph_inputs_matches_eager_on_host(tiny_model):
    config = dict(block_size=16, num_kv_blocks=64, cuda_graphs=False)
    eager = prompts_one_by_one(AREngine(tiny_model, EngineConfig(**config)), prompts())
    engine = AREngine(tiny_model, EngineConfig(**config))
    engine.runner.prefill_graphs = PrefillGraphs(engine.runner, [1], [16, 32, 64], [4], capture=capture_eagerly)
    assert sorted(engine.runner.prefill_graphs.graphs) == [(1, 16, 4), (1, 32, 4), (1, 64, 4)]
    assert prompts_one_by_one(engine, prompts()) == eager
    # every prompt but the 150-token one prefilled in a graph; the cached prefix was not recomputed
    assert engine.runner.prefill_graphs.replays == 5
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_chunks_of_a_long_prompt_continue_in_graphs_on_host(tiny_model):
    # chunks of 24, each continuing the cache the one before wrote: a 60-token prompt in three
    # graph steps; a 100-token one (blocks for all of it, wider than the graphs) in two, then eagerly
    config = dict(block_size=16, num_kv_blocks=64, cuda_graphs=False, max_num_batched_tokens=24, enable_prefix_caching=False)
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (60, 100)]
    eager = prompts_one_by_one(AREngine(tiny_model, EngineConfig(**config)), prompts)
    engine = AREngine(tiny_model, EngineConfig(**config))
    engine.runner.prefill_graphs = PrefillGraphs(engine.runner, [1], [16, 32], [4], capture=capture_eagerly)
    assert prompts_one_by_one(engine, prompts) == eager
    assert engine.runner.prefill_graphs.replays == 3 + 2


def test_embedding_prompts_prefill_in_graphs_on_host(tiny_model):
    # prompt embeddings (a talker's prompt) replace the looked-up rows before the graph replays
    from omni_core.scheduler import EngineRequest

    embeds = torch.randn(21, tiny_model.hidden_size, generator=torch.Generator().manual_seed(5))
    config = dict(block_size=16, num_kv_blocks=64, cuda_graphs=False)
    tokens = {}
    for graphs in (False, True):
        engine = AREngine(tiny_model, EngineConfig(**config))
        if graphs:
            engine.runner.prefill_graphs = PrefillGraphs(engine.runner, [1], [32], [4], capture=capture_eagerly)
        engine.add_request(EngineRequest("e", prompt_embeds=embeds, params=GREEDY))
        out = []
        while engine.has_unfinished():
            out += [t for o in engine.step() for t in o.new_token_ids]
        tokens[graphs] = out
    assert engine.runner.prefill_graphs.replays == 1
    assert tokens[True] == tokens[False] and len(tokens[True]) == GREEDY.max_tokens


def test_several_prompts_prefill_in_one_padded_graph_on_host(tiny_model):
    # five prompts in one step (padded to 8 sequences of 64 rows), then prompts continuing cached
    # prefixes beside a fresh one; a step of 9 sequences is larger than every graph: eager
    config = dict(block_size=16, num_kv_blocks=64, cuda_graphs=False)
    g = torch.Generator().manual_seed(6)
    first = [torch.randint(0, 128, (n,), generator=g).tolist() for n in (3, 17, 40, 5, 9)]
    second = [first[2] + [1, 2], first[1] + [3], torch.randint(0, 128, (20,), generator=g).tolist()]
    third = [[k, k + 1, k + 2] for k in range(9)]
    eager_engine = AREngine(tiny_model, EngineConfig(**config))
    eager = [[o.token_ids for o in eager_engine.generate(p, GREEDY)] for p in (first, second, third)]
    engine = AREngine(tiny_model, EngineConfig(**config))
    engine.runner.prefill_graphs = PrefillGraphs(engine.runner, [1, 4, 8], [16, 32, 64], [4], capture=capture_eagerly)
    assert (8, 64, 4) in engine.runner.prefill_graphs.graphs
    assert [[o.token_ids for o in engine.generate(p, GREEDY)] for p in (first, second, third)] == eager
    assert engine.runner.prefill_graphs.replays == 2
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


def test_padding_writes_only_the_scratch_slot_on_host(tiny_model):
    # a step of 3 prompts padded to 4 sequences of 32 rows changes the cache only at its tokens'
    # slots and the scratch block, never another sequence's
    from omni_core.scheduler import EngineRequest

    engine = AREngine(tiny_model, EngineConfig(block_size=16, num_kv_blocks=64, cuda_graphs=False))
    runner = engine.runner
    runner.prefill_graphs = PrefillGraphs(runner, [4], [32], [4], capture=capture_eagerly)
    engine.generate([[7] * 40], GREEDY)  # blocks 0.. hold this prompt's KV, kept by the prefix cache
    before = runner.kv_cache.clone()
    for i, n in enumerate((5, 20, 9)):
        engine.add_request(EngineRequest(f"r{i}", prompt_token_ids=[i + 1] * n, params=GREEDY))
    engine.step()  # the three prefills, in one graph
    assert runner.prefill_graphs.replays == 1
    written = {s.block_table[p // 16] * 16 + p % 16 for s in engine.requests.values() for p in range(s.num_computed_tokens)}
    changed = set((runner.kv_cache != before).any(dim=(0, 1, 3, 4)).nonzero().flatten().tolist())
    scratch = set(range(runner.scratch_slot, runner.scratch_slot + 16))
    assert changed - scratch == written and changed & scratch


def test_returned_hidden_layers_or_rotary_offsets_prefill_eagerly_on_host(tiny_model):
    from omni_core.scheduler import EngineRequest

    config = dict(block_size=16, num_kv_blocks=64, cuda_graphs=False)
    engine = AREngine(tiny_model, EngineConfig(**config))
    engine.runner.prefill_graphs = PrefillGraphs(engine.runner, [1, 4], [16, 32], [4], capture=capture_eagerly)
    engine.add_request(EngineRequest("layers", prompt_token_ids=[9, 8, 7], params=GREEDY, hidden_layers=(1,)))
    engine.add_request(EngineRequest("rope", prompt_token_ids=[6, 5, 4], params=GREEDY, rope_positions=torch.tensor([0, 5, 9])))
    while engine.has_unfinished():
        engine.step()
    assert engine.runner.prefill_graphs.replays == 0
    engine.generate([[1, 2, 3], [4, 5, 6, 7]], GREEDY)
    assert engine.runner.prefill_graphs.replays == 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_prefill_graphs_match_eager_on_cuda(tiny_checkpoint):
    from omni_core.models import load_causal_lm

    model = load_causal_lm(tiny_checkpoint[1], device="cuda", dtype=torch.float32)
    config = dict(block_size=16, num_kv_blocks=64, cuda_graph_kv_lens=(64,), cuda_graph_prefill_batches=(1, 4))
    eager = prompts_one_by_one(AREngine(model, EngineConfig(**config, cuda_graphs=False), device="cuda"), prompts())
    engine = AREngine(model, EngineConfig(**config), device="cuda")
    assert sorted(engine.runner.prefill_graphs.graphs) == [(b, s, 4) for b in (1, 4) for s in (16, 32, 64)]
    assert prompts_one_by_one(engine, prompts()) == eager
    assert engine.runner.prefill_graphs.replays == 5
    sampled = SamplingParams(temperature=0.8, top_p=0.9, max_tokens=8, seed=5, ignore_eos=True)
    plain = AREngine(model, EngineConfig(**config, cuda_graphs=False), device="cuda")
    together = prompts()[:4]  # one step of four prompts
    assert [o.token_ids for o in engine.generate(together, sampled)] == [o.token_ids for o in plain.generate(together, sampled)]
    assert engine.runner.prefill_graphs.replays == 6
