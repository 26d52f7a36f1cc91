"""An AR stage on a stream of its own (``EngineConfig.stream``): through the real `ar` executor it
gives the tokens it gives on the shared stream, and reads a device tensor its input brings only
once the default stream that wrote it got there. On the CPU the setting changes nothing."""

import pytest
import torch
from omni_core.hooks import choice_option
from omni_core.scheduler import AREngine, ARStageWorker, EngineConfig
from omni_core.scheduler.engine import ENGINE_STREAMS
from omni_core.scheduler.executor import Message

from .test_ar_executor import Collector, start_executor

PARAMS = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}


class Run:
    """An `ar` executor over ``model`` on ``device`` whose engine runs on ``stream``."""

    def __init__(self, model, device: str, stream: str):
        config = EngineConfig(block_size=16, num_kv_blocks=64, cuda_graph_sizes=(1, 2, 4), stream=stream)
        self.collector = Collector()
        self.executor = start_executor(lambda ctx: ARStageWorker(model, engine_config=config), self.collector, device)

    def generate(self, payloads: dict[str, dict]) -> dict[str, list[int]]:
        for rid, payload in payloads.items():
            self.executor.submit(Message(rid, "in", {**payload, "sampling": PARAMS}))
        assert self.collector.wait(lambda c: all(c.ended(rid) for rid in payloads)), self.collector.failures
        assert not self.collector.failures
        stats = self.executor.engine.stats()
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
        return {rid: self.collector.tokens(rid) for rid in payloads}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.executor.stop()


def _generate(model, device: str, stream: str, payloads: dict[str, dict]) -> dict[str, list[int]]:
    with Run(model, device, stream) as run:
        return run.generate(payloads)


def test_an_unknown_stream_is_refused(tiny_model):
    with pytest.raises(ValueError, match="EngineConfig.stream must be one of shared, own, high"):
        AREngine(tiny_model, EngineConfig(stream="fast"))
    assert choice_option({}, "talker_stream", ENGINE_STREAMS) == "shared"
    assert choice_option({"llm_stream": "High"}, "llm_stream", ENGINE_STREAMS) == "high"
    with pytest.raises(ValueError, match="option llm_stream='fast'"):
        choice_option({"llm_stream": "fast"}, "llm_stream", ENGINE_STREAMS)


def test_on_the_cpu_a_stream_of_its_own_changes_nothing(tiny_model):
    prompts = {"a": {"prompt_token_ids": [5, 17, 99, 3]}, "b": {"prompt_token_ids": [7, 1, 2]}}
    with Run(tiny_model, "cpu", "high") as run:
        assert run.executor.loop.stream is not None  # the setting reaches the loop, whose stream is the host's order
        assert run.generate(prompts) == _generate(tiny_model, "cpu", "shared", prompts)
        assert run.executor.loop.stream.stream is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("stream", ["own", "high"])
def test_on_cuda_an_own_stream_gives_the_shared_streams_tokens(tiny_checkpoint, stream):
    from omni_core.models import load_causal_lm

    model = load_causal_lm(tiny_checkpoint[1], device="cuda", dtype=torch.float32)
    g = torch.Generator().manual_seed(0)
    prompts = {str(n): {"prompt_token_ids": torch.randint(0, 128, (n,), generator=g).tolist()} for n in (3, 17, 40)}
    ids = torch.tensor(prompts["17"]["prompt_token_ids"], device="cuda")
    shared = _generate(model, "cuda", "shared", {**prompts, "e": {"prompt_embeds": model.embed(ids)}})
    with Run(model, "cuda", stream) as run:
        assert run.generate(prompts) == {k: v for k, v in shared.items() if k != "e"}
        own = run.executor.loop.stream.stream
        assert own != torch.cuda.default_stream() and own.priority == (torch.cuda.Stream.priority_range()[1] if stream == "high" else 0)
        # prompt embeddings written on the default stream behind a long kernel: the engine's
        # stream (made by the requests above) must wait for them; zeros read early give other tokens
        written = torch.zeros(len(ids), model.hidden_size, device="cuda")
        torch.cuda._sleep(200_000_000)  # ~0.1 s of the default stream
        written.copy_(model.embed(ids))
        assert run.generate({"e": {"prompt_embeds": written}}) == {"e": shared["e"]}
        zeros = run.generate({"z": {"prompt_embeds": torch.zeros_like(written)}})["z"]
        assert zeros != shared["e"]  # what reading too early would have given
