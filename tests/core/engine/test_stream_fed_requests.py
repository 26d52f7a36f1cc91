"""An `ar` stage fed by a stream: later chunks reach the running request (`on_input`), a request
waiting for its next chunk is paused (keeps its KV blocks, sits out the steps) and resumed by
it; pausing changes none of its tokens; other requests run on meanwhile; an aborted paused
request frees its blocks."""

from omni_core.scheduler import AREngine, ARStageWorker, EngineConfig, EngineRequest, SamplingParams
from omni_core.scheduler.executor import Message

from .test_ar_executor import Collector, start_executor

PROMPT = [5, 17, 3, 99, 42, 7]


class GrantedWorker(ARStageWorker):
    """Each chunk grants a request more tokens; it is paused when it has used its grants."""

    def __init__(self, model):
        super().__init__(model, engine_config=EngineConfig(block_size=4, num_kv_blocks=64))
        self.granted: dict[str, int] = {}
        self.made: dict[str, int] = {}
        self.most_ahead = 0  # the largest count of tokens made past what was granted (must stay 0)

    def make_request(self, message):
        self.granted[message.request_id] = message.payload["grant"]
        self.made[message.request_id] = 0
        payload = {"prompt_token_ids": PROMPT, "sampling": {"temperature": 0, "max_tokens": message.payload["max_tokens"], "ignore_eos": True}}
        return super().make_request(Message(message.request_id, "in", payload))

    def on_input(self, message):
        self.granted[message.request_id] += message.payload["grant"]
        self.engine.resume(message.request_id)

    def on_output(self, request_id, new_token_ids, finished, step_outputs, emit):
        self.made[request_id] += len(new_token_ids)
        self.most_ahead = max(self.most_ahead, self.made[request_id] - self.granted[request_id])
        if not finished and self.made[request_id] >= self.granted[request_id]:
            self.engine.pause(request_id)
        return super().on_output(request_id, new_token_ids, finished, step_outputs, emit)


def test_paused_until_fed_and_the_same_tokens(tiny_model):
    collector = Collector()
    worker = GrantedWorker(tiny_model)
    executor = start_executor(lambda ctx: worker, collector)
    try:
        executor.submit(Message("free", "in", {"grant": 100, "max_tokens": 12}))
        executor.submit(Message("fed", "in", {"grant": 2, "max_tokens": 12}))
        executor.submit(Message("starved", "in", {"grant": 3, "max_tokens": 12}))
        # "free" finishes while the other two wait for chunks
        assert collector.wait(lambda c: c.ended("free") and len(c.tokens("fed")) == 2 and len(c.tokens("starved")) == 3)
        assert executor.engine.stats()["running"] == 2 and not executor.engine.has_runnable()
        for seq in range(1, 6):  # five more grants of two: 12 tokens in all
            executor.submit(Message("fed", "in", {"grant": 2}, end=seq == 5, seq=seq))
            assert collector.wait(lambda c, n=2 + 2 * seq: len(c.tokens("fed")) >= min(n, 12))
        assert collector.wait(lambda c: c.ended("fed"))
        assert collector.tokens("fed") == collector.tokens("free")  # pausing changed nothing
        assert worker.most_ahead == 0 and len(collector.tokens("starved")) == 3
        executor.submit(Message("gone", "in", {"grant": 1}, seq=1))  # a chunk for no request: dropped
        executor.abort("starved")
        stats = {}
        assert collector.wait(lambda c: (stats.update(executor.stats()) or stats.get("running") == 0))
        assert stats["kv_blocks_free"] == stats["kv_blocks_total"] and collector.failures == []
    finally:
        executor.stop()


def test_a_stage_of_one_message_a_request_refuses_a_second(tiny_model):
    collector = Collector()
    executor = start_executor(lambda ctx: ARStageWorker(tiny_model, engine_config=EngineConfig(block_size=4, num_kv_blocks=64)), collector)
    try:
        executor.submit(Message("r", "in", {"prompt_token_ids": PROMPT, "sampling": {"temperature": 0, "max_tokens": 200, "ignore_eos": True}}))
        assert collector.wait(lambda c: len(c.tokens("r")) >= 1)
        executor.submit(Message("r", "in", {}, seq=1))
        assert collector.wait(lambda c: c.failures)
        assert "takes one message a request" in collector.failures[0][1]
    finally:
        executor.stop()


def test_paused_requests_give_their_blocks_up_first(tiny_model):
    """A request that needs a block others hold preempts a paused one (recomputed once resumed),
    not itself: the paused request's tokens are still those it makes alone."""
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    alone = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=16)).generate([PROMPT], params)[0].token_ids
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=8))  # 7 blocks make one whole request
    tokens = {"paused": [], "other": []}

    def step():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids

    engine.add_request(EngineRequest("paused", prompt_token_ids=PROMPT, params=params))
    while len(tokens["paused"]) < 4:
        step()
    engine.pause("paused")
    engine.add_request(EngineRequest("other", prompt_token_ids=PROMPT, params=params))
    while engine.has_runnable():
        step()
    assert tokens["other"] == alone and engine.stats()["preemptions"] > 0
    engine.resume("paused")
    while engine.has_unfinished():
        step()
    assert tokens["paused"] == alone
    assert engine.stats()["kv_blocks_free"] == engine.stats()["kv_blocks_total"]
