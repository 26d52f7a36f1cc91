"""A request past its deadline in a pipeline of one `ar` stage: stopped mid-generation, every
KV block back, nothing running."""

import time

import pytest
from omni_core.hooks import get_plugin_manager
from omni_core.pipeline import DeadlineExceeded, Pipeline, StageSpec, Topology
from omni_core.scheduler import ARStageWorker, EngineConfig

BLOCKS = 128


def test_a_deadline_mid_generation_frees_every_kv_block(tiny_model):
    def slow_output(request_id, new_token_ids, finished, step_outputs, emit):
        emit("tokens", {"token_ids": list(new_token_ids)}, end=finished)
        time.sleep(0.005)  # ~2.5 s for the whole request: it is mid-generation at its deadline

    def factory(context):
        return ARStageWorker(tiny_model, engine_config=EngineConfig(block_size=4, num_kv_blocks=BLOCKS), on_output=slow_output)

    llm = StageSpec("llm", "ar", factory, outputs=("tokens",))
    topology = Topology(stages=[llm], edges=[], entry="llm.in", outputs={"tokens": "llm.tokens"}, name="one-ar")
    request = {"prompt_token_ids": [1, 2, 3], "sampling": {"max_tokens": 500, "ignore_eos": True}}
    with Pipeline(topology, plugin_manager=get_plugin_manager()) as pipeline:
        handle = pipeline.submit(request, deadline=time.monotonic() + 0.3)
        received = 0
        with pytest.raises(DeadlineExceeded):
            while (event := handle.get(timeout=10)) is not None:
                received += len(event.payload["token_ids"])
        assert 0 < received < 500
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            llm = pipeline.stats()["stages"]["llm"]
            if llm["kv_blocks_free"] == BLOCKS and llm["running"] == 0:
                break
            time.sleep(0.01)
        assert llm["kv_blocks_free"] == BLOCKS and llm["running"] == 0 and llm["kv_usage"] == 0, llm
        assert pipeline.running() == []
