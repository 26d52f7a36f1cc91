"""On a GPU: the thinker on CUDA, its MoE layers in the fused kernels and its decode steps in
CUDA graphs, gives transformers' greedy tokens (float32) for the eight chats together; in
bfloat16 it serves them too. The talker's decode graphs and the code predictor's graphs give the
codes and speech of the same stages launched kernel by kernel. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch
from omni_core.scheduler.engine import AREngine, EngineConfig
from omni_core.scheduler.executor import Message

from .test_qwen3_omni_parity import NEW_TOKENS, Stages, chats, expected  # noqa: F401 - fixture
from .test_qwen3_omni_speech_parity import SpeakingPipeline
from .test_qwen3_omni_speech_parity import chats as speech_chats

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


def test_talker_in_cuda_graphs_speaks_as_without_them(tiny_dir):
    """The talker's decode graphs and the code predictor's graphs change nothing: the same codes
    and samples as the same stages on CUDA launching kernel by kernel."""
    runs = []
    for graphs in (True, False):
        pipeline = SpeakingPipeline(tiny_dir, device="cuda", cuda_graphs=graphs)
        assert bool(pipeline.talker_engine.runner.graphs) == graphs and (pipeline.talker.predictor_graphs is not None) == graphs
        runs.append(pipeline.run(speech_chats()))
    for name in speech_chats():
        assert runs[0][name]["ids"] == runs[1][name]["ids"]
        assert runs[0][name]["codes"].tolist() == runs[1][name]["codes"].tolist(), name
        torch.testing.assert_close(torch.as_tensor(runs[0][name]["audio"]), torch.as_tensor(runs[1][name]["audio"]))
