"""Speech out against transformers' Qwen3-Omni on the tiny preset's weights (float32, CPU): chats
submitted together through every stage's worker (preprocess, encoders, the thinker streaming its
ids and states to the talker, which starts before the thinker ends, the code predictor inside
the talker's steps, code2wav) give the same reply and the same speech as transformers'
``generate(..., return_audio=True)`` of each chat, with greedy thinker, talker and code
predictor: every frame's codes equal, and the
waveform within float32 rounding of the reference's scale. The frames are decoded in one chunk
here (as the reference does below 300 frames); chunked decoding is checked in the modules' test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from omni_core.scheduler.engine import AREngine, EngineConfig
from omni_core.scheduler.executor import Message

from .conftest import noise, png
from .test_qwen3_omni_parity import NEW_TOKENS, Stages, hf_inputs

TALKER_TOKENS = 24
EMPTY_REPLY = [{"role": "user", "content": [{"type": "text", "text": "Hello there, how are you?"}]}]


def chats() -> dict[str, list[dict]]:
    return {
        "text": [{"role": "user", "content": [{"type": "text", "text": "Good morning! What is new?"}]}],
        # earlier assistant turns and the system turn are not read by the talker
        "system+turns": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
            {"role": "user", "content": [{"type": "text", "text": "Tell me more, please."}]},
        ],
        "audio": [{"role": "user", "content": [{"type": "audio", "audio": noise(2.3)}, {"type": "text", "text": "Say it back"}]}],
        "image": [{"role": "user", "content": [{"type": "image", "image": png(64, 96)}, {"type": "text", "text": "What is it?"}]}],
    }


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from omni_qwen3_omni.config import quiet_transformers
    from transformers import Qwen3OmniMoeForConditionalGeneration

    with quiet_transformers():
        return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def speech_expected(tiny_dir, hf_model):
    """transformers' reply ids and waveform for each chat, alone."""
    stages = Stages(tiny_dir)
    eos = list(stages.ckpt.tokens.eos)
    out = {}
    decode = hf_model.code2wav.chunked_decode
    for name, messages in chats().items():
        inputs, _ = stages.inputs(messages)
        prompt_len = len(inputs["prompt"]["token_ids"])
        seen = []

        def recording(codes, *args, seen=seen, **kwargs):  # the codes transformers decodes, then its own decode
            seen.append(codes.clone())
            return decode(codes, *args, **kwargs)

        hf_model.code2wav.chunked_decode = recording
        with torch.no_grad():
            ids, wav = hf_model.generate(
                **hf_inputs(inputs), speaker="ethan", return_audio=True, thinker_max_new_tokens=NEW_TOKENS,
                thinker_do_sample=False, thinker_eos_token_id=eos, talker_do_sample=False, talker_max_new_tokens=TALKER_TOKENS,
            )
        hf_model.code2wav.chunked_decode = decode
        out[name] = (ids[0, prompt_len:].tolist(), seen[0][0], wav.reshape(-1).numpy())
    return out


class SpeakingPipeline:
    """The family's workers of every stage driven by hand in lock-step (one thinker step, then one
    talker step), so the batches each engine runs are the same every time: the replies of a tiny
    random MoE can flip on a near-tie in expert routing when a batch's composition changes."""

    def __init__(self, tiny_dir: str, device: str = "cpu", cuda_graphs: bool = True, **talker_engine):
        from omni_qwen3_omni.checkpoint import (
            load_code2wav,
            load_code_predictor,
            load_talker,
            load_thinker_embedding,
        )
        from omni_qwen3_omni.code2wav_stage import Chunking, Code2WavWorker
        from omni_qwen3_omni.speech import SpeechIds
        from omni_qwen3_omni.stages import Preprocessor
        from omni_qwen3_omni.talker_stage import TalkerSampling, TalkerWorker

        self.stages = Stages(tiny_dir)
        ckpt = self.stages.ckpt
        self.stages.pre = Preprocessor(ckpt, self.stages.pre.limits, speaks=True)
        self.thinker, self.thinker_engine = self.stages.worker(speaks=True)
        model, projections = load_talker(ckpt, device, torch.float32)
        self.talker = TalkerWorker(model, projections, load_code_predictor(ckpt, device, torch.float32), load_thinker_embedding(ckpt, device, torch.float32),
                                   SpeechIds.of(ckpt), EngineConfig(**{"block_size": 8, "max_num_seqs": 8, "cuda_graphs": cuda_graphs, **talker_engine}), TalkerSampling(temperature=0, max_tokens=TALKER_TOKENS))
        self.talker_engine = AREngine(model, self.talker.engine_config, hooks=self.talker.hooks, device=device)
        self.talker.engine, self.talker.max_model_len = self.talker_engine, self.talker_engine.max_model_len
        self.code2wav = Code2WavWorker(load_code2wav(ckpt, device, torch.float32), Chunking(first_chunk=300, chunk=300))

    def run(self, chats: dict[str, list[dict]]) -> dict[str, dict]:
        out = {name: {"ids": [], "frames": [], "audio": []} for name in chats}
        for name, messages in chats.items():
            _, joined = self.stages.inputs(messages, rid=name, modalities=["text", "audio"], voice="ethan")
            self.thinker_engine.add_request(self.thinker.make_request(Message(name, "*", joined)))
        seq: dict[str, int] = {}

        def thinker_emit(name):
            def emit(port, payload, end=False):
                if port == "hidden":
                    message = Message(name, "in", payload, end=end, seq=seq.setdefault(name, 0))
                    seq[name] += 1
                    if message.seq == 0:
                        self.talker_engine.add_request(self.talker.make_request(message))
                    elif name in self.talker_engine.requests:
                        self.talker.on_input(message)
            return emit

        def talker_emit(name):
            def emit(port, payload, end=False):
                message = Message(name, "in", payload, end=end, seq=len(out[name]["frames"]))
                out[name]["frames"].append(payload["codes"])
                self.code2wav.process([message], lambda rid, port, p, end=False: out[rid]["audio"].append(p["audio"]))
            return emit

        self.waits = 0  # rounds in which every talker request waited for the thinker's next token
        while self.thinker_engine.has_unfinished() or self.talker_engine.has_runnable():
            self.waits += self.talker_engine.has_unfinished() and not self.talker_engine.has_runnable()
            if self.thinker_engine.has_unfinished():
                for o in self.thinker_engine.step():
                    out[o.request_id]["ids"] += o.new_token_ids
                    if self.thinker.on_output(o.request_id, o.new_token_ids, o.finished, o.step_outputs, thinker_emit(o.request_id)):
                        self.thinker_engine.abort(o.request_id)
            if self.talker_engine.has_runnable():
                for o in self.talker_engine.step():
                    if self.talker.on_output(o.request_id, o.new_token_ids, o.finished, o.step_outputs, talker_emit(o.request_id)):
                        self.talker_engine.abort(o.request_id)
        assert not self.talker_engine.has_unfinished()
        for stats in (self.thinker_engine.stats(), self.talker_engine.stats()):  # every KV block back
            assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
        for item in out.values():
            item["codes"] = torch.cat(item["frames"]).T
            item["audio"] = torch.cat(item["audio"]).numpy()
        return out


def test_speech_equals_transformers_generate(tiny_dir, speech_expected):
    pipeline = SpeakingPipeline(tiny_dir)
    check_against_transformers(pipeline, speech_expected)
    assert pipeline.waits > 0  # the talker started before the thinker ended, and caught up with it


def test_preempted_talker_requests_are_recomputed_to_the_same_speech(tiny_dir, speech_expected):
    """Too few talker KV blocks for the four chats at once: requests are preempted (paused ones
    first) and recomputed, their decode steps' additions replayed; the speech is unchanged."""
    pipeline = SpeakingPipeline(tiny_dir, num_kv_blocks=14)
    check_against_transformers(pipeline, speech_expected)
    assert pipeline.talker_engine.stats()["preemptions"] > 0


def check_against_transformers(pipeline: SpeakingPipeline, expected: dict) -> None:
    results = pipeline.run({**chats(), "empty": EMPTY_REPLY})
    empty = results.pop("empty")
    # the preset's greedy reply to this one is its end of turn alone: nothing to voice (transformers
    # cannot voice it: its talker prompt lacks the reply's first row)
    assert len(empty["ids"]) == 1 and empty["audio"].size == 0 and empty["codes"].numel() == 0
    assert set(results) == set(chats())
    for name, (ids, codes, wav) in expected.items():
        ours = results[name]
        assert ours["ids"] == ids, name
        assert codes.shape[-1] > 4, name  # the talker spoke several frames before its eos or the limit
        assert ours["codes"].tolist() == codes.tolist(), name
        assert ours["audio"].shape == wav.shape, name
        scale = float(np.abs(wav).max())
        assert scale > 0, name
        np.testing.assert_allclose(ours["audio"] / scale, wav / scale, atol=1e-4, rtol=0, err_msg=name)
