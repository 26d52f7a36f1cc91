"""On a GPU: the fast AR of a step replayed from CUDA graphs (one per padded batch size and
sampler path) gives the codes the same fast AR gives launched kernel by kernel, greedy and
sampled, at graph sizes and padded ones; the dual AR stage captures its graphs at start-up and
serves through them. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from omni_core.scheduler.engine import AREngine, EngineConfig
from omni_core.scheduler.executor import Message
from omni_core.scheduler.sampling_params import SamplingParams
from omni_fish_s2pro.checkpoint import load_fast_ar, load_slow_ar
from omni_fish_s2pro.config import load_config, token_ids
from omni_fish_s2pro.dual_ar_stage import DEFAULT_SAMPLING, DualARWorker
from omni_fish_s2pro.fast_ar_graphs import SIZES, FastARGraphs
from omni_fish_s2pro.sampling import StepSampler

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

SAMPLED = SamplingParams(**DEFAULT_SAMPLING)
MIXED = [SAMPLED, SamplingParams(temperature=0.0), SamplingParams(temperature=1.1, top_p=0.95, top_k=12)]


def _eager_padded(fast, sampling, hidden, code0, params, seeds, done, size, fused):
    """The eager fast AR on the batch padded to ``size`` with copies of row 0 (so its matrix
    products take the graph's shapes, and the sampler the same path), cut back to the rows."""
    pad = size - hidden.shape[0]
    hidden = torch.cat([hidden, hidden[:1].expand(pad, -1)])
    code0 = torch.cat([code0, code0[:1].expand(pad)])
    chooser = sampling.fast_chooser(params + params[:1] * pad, seeds + seeds[:1] * pad, done + done[:1] * pad)
    return fast(hidden, code0, chooser, fused=fused)[: len(params)]


@pytest.mark.parametrize("fused", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("kind", ["greedy", "sampled", "mixed"])
def test_graph_replays_give_the_codes_of_the_eager_fast_ar(tiny_dir, rows, kind, fused):
    cfg = load_config(tiny_dir)
    fast = load_fast_ar(tiny_dir, "cuda", torch.float32)
    sampling = StepSampler(torch.device("cuda"), cfg.num_codebooks)
    graphs = FastARGraphs(fast, sampling, cfg.slow.dim, torch.float32, fused=fused)
    graphs.capture(8, [SAMPLED])
    torch.manual_seed(rows)
    params = {
        "greedy": [SamplingParams(temperature=0.0)] * rows,
        "sampled": [SAMPLED] * rows,
        "mixed": (MIXED * rows)[:rows],
    }[kind]
    seeds, done = [11 + i for i in range(rows)], [3 * i for i in range(rows)]
    for _ in range(3):  # replays of the same graph with new inputs each time
        hidden = torch.randn(rows, cfg.slow.dim, device="cuda")
        code0 = torch.randint(0, cfg.codebook_size, (rows,), device="cuda")
        replayed = graphs(hidden, code0, params, seeds, done)
        size = next(s for s in SIZES if s >= rows)
        assert (size, sampling.fast_path(params)) in graphs.graphs
        assert torch.equal(replayed, _eager_padded(fast, sampling, hidden, code0, params, seeds, done, size, fused))
        done = [d + 1 for d in done]


def test_the_stage_captures_its_fast_graphs_at_start_up_and_speaks_through_them(tiny_dir):
    cfg = load_config(tiny_dir)
    worker = DualARWorker(
        load_slow_ar(tiny_dir, "cuda", torch.float32),
        load_fast_ar(tiny_dir, "cuda", torch.float32),
        token_ids(tiny_dir, cfg.codebook_size),
        EngineConfig(block_size=16, max_num_seqs=4, cuda_graph_sizes=(1, 2, 4), kv_cache_bytes=1 << 26),
        max_new_tokens=8,
    )
    assert worker.fast_graphs is not None
    captured = set(worker.fast_graphs.graphs)
    assert {(s, None) for s in (1, 2, 4)} <= captured  # greedy and the default path, up to the batch
    assert {(s, worker.sampling.fast_path([SAMPLED])) for s in (1, 2, 4)} <= captured
    engine = AREngine(worker.model, worker.engine_config, hooks=worker.hooks, device="cuda")
    worker.engine, worker.max_model_len = engine, engine.max_model_len
    ids = token_ids(tiny_dir, cfg.codebook_size)
    prompt = [ids.im_start, 10, 11, 12, ids.im_end, ids.im_start, 13, ids.voice]
    payload = {"token_ids": prompt, "frames": torch.zeros(cfg.num_codebooks, 0), "seed": 5, "sampling": {}}
    engine.add_request(worker.make_request(Message("r", "in", payload, True, 0)))
    frames = []
    while engine.has_unfinished():
        for out in engine.step():
            worker.on_output(
                out.request_id, out.new_token_ids, out.finished, out.step_outputs,
                lambda port, p, end=False: frames.append(p["codes"]),
            )  # fmt: skip
    codes = torch.cat(frames)  # every step ran the fast AR, the end token's too (its frame not voiced)
    assert codes.shape[1] == cfg.num_codebooks and codes.shape[0] <= 8
    assert bool(((codes >= 0) & (codes < cfg.codebook_size)).all())
    assert len(worker.fast_graphs.graphs) == len(captured)  # the default sampling's graphs served: none new
