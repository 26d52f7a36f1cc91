"""On a GPU: the thinker on CUDA, its MoE layers in the fused kernels and its decode steps in
CUDA graphs, gives transformers' greedy tokens (float32) for the eight chats together; in
bfloat16 it serves them too. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from omni_core.scheduler.engine import AREngine, EngineConfig
from omni_core.scheduler.executor import Message

from .test_qwen3_omni_parity import NEW_TOKENS, Stages, chats, expected  # noqa: F401 - fixture

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def stages(tiny_dir):
    return Stages(tiny_dir)


def _run_on_cuda(stages, dtype: torch.dtype):
    from omni_qwen3_omni.checkpoint import load_thinker
    from omni_qwen3_omni.stages import ThinkerWorker

    model = load_thinker(stages.ckpt, "cuda", dtype)
    worker = ThinkerWorker(model, stages.ckpt, EngineConfig(block_size=8, eos_token_ids=stages.ckpt.tokens.eos, cuda_graph_sizes=(1, 2, 4, 8)), {})
    engine = AREngine(model, worker.engine_config, device="cuda")
    worker.max_model_len = engine.max_model_len
    assert model.supports_cuda_graphs and engine.runner.graphs, "MoE decode must run in CUDA graphs"
    tokens = {}
    for name, messages in chats().items():
        _, joined = stages.inputs(messages, rid=name)
        engine.add_request(worker.make_request(Message(name, "*", joined)))
        tokens[name] = []
    while engine.has_unfinished():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
    stats = engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    return tokens


def test_cuda_graphs_with_fused_moe_give_transformers_tokens(stages, expected):  # noqa: F811 - the imported fixture
    assert _run_on_cuda(stages, torch.float32) == expected


def test_bfloat16_on_cuda_generates(stages):
    tokens = _run_on_cuda(stages, torch.bfloat16)
    assert all(len(t) == NEW_TOKENS or t[-1] in stages.ckpt.tokens.eos for t in tokens.values())
