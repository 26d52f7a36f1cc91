"""`--log-level debug` shows when each request got into the engine and each engine step: its
stage, kind, sequences and time."""

import logging
import re
import threading

from omni_core.scheduler import AREngine, EngineConfig, EngineRequest, SamplingParams
from omni_core.scheduler.engine_loop import EngineLoop


def test_each_step_is_logged_at_debug(tiny_model, caplog):
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=64))
    done = threading.Event()

    def on_outputs(outputs):
        if any(o.finished for o in outputs):
            done.set()

    loop = EngineLoop(engine, on_outputs, lambda request_id, message: done.set(), name="ar-thinker")
    caplog.set_level(logging.DEBUG, logger="omni_core.scheduler.engine_loop")
    loop.start()
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    loop.add("r", lambda: EngineRequest("r", prompt_token_ids=[5, 17, 99, 3], params=params))
    assert done.wait(30)
    loop.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "omni_core.scheduler.engine_loop"]
    assert re.fullmatch(r"ar-thinker: request r taken in \d+\.\d ms after it arrived", lines[0]), lines
    steps = lines[1:]
    pattern = re.compile(r"ar-thinker: (prefill|decode) of 1 sequences, \d+\.\d ms")
    assert [pattern.fullmatch(s).group(1) for s in steps[:2]] == ["prefill", "decode"], steps
    assert len(steps) == 4  # one prefill and three decode steps for four tokens
