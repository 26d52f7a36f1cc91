"""Parity with transformers' Qwen3-Omni thinker on the same tiny random weights (float32, CPU):
the audio encoder, the vision encoder with its deepstack features, the thinker's logits at
prefill, and greedy tokens equal to transformers' generate for text, audio, image, video and
mixed prompts submitted together (continuous batching), with the prefix cache on and off,
chunked prefill and preemption; and the same on a checkpoint whose special ids differ."""

from __future__ import annotations

import pytest
import torch
from omni_core.models.mel import log_mel
from omni_core.scheduler.engine import AREngine, EngineConfig
from omni_core.scheduler.executor import Message

from .conftest import LIMITS, mp4, noise, png

NEW_TOKENS = 12


class Stages:
    """The family's stage workers of one checkpoint, run by hand: chat -> engine request."""

    def __init__(self, path: str):
        from omni_qwen3_omni.checkpoint import load_audio_encoder, load_thinker, load_vision_encoder
        from omni_qwen3_omni.config import load_checkpoint
        from omni_qwen3_omni.stages import AudioEncoderWorker, Preprocessor, VisionEncoderWorker

        self.ckpt = ckpt = load_checkpoint(path)
        self.pre = Preprocessor(ckpt, LIMITS)
        self.audio = AudioEncoderWorker(load_audio_encoder(ckpt, "cpu", torch.float32), ckpt)
        self.vision = VisionEncoderWorker(load_vision_encoder(ckpt, "cpu", torch.float32), ckpt)
        self.model = load_thinker(ckpt, "cpu", torch.float32)

    def inputs(self, messages, rid="r", **extra):
        out = {}
        payload = {"task": "chat", "messages": messages, "sampling": {"temperature": 0, "max_tokens": NEW_TOKENS}, **extra}
        self.pre(Message(rid, "in", payload),
                 lambda port, payload, end=True: out.__setitem__(port, payload))
        joined = {"prompt": out["prompt"]}
        if "audio" in out:
            self.audio.process([Message(rid, "in", out["audio"])], lambda r, port, payload, end=True: joined.__setitem__("audio", payload))
        if "vision" in out:
            self.vision.process([Message(rid, "in", out["vision"])], lambda r, port, payload, end=True: joined.__setitem__("vision", payload))
        return out, joined

    def worker(self, speaks: bool = False, **engine):
        from omni_qwen3_omni.stages import ThinkerWorker

        worker = ThinkerWorker(self.model, self.ckpt, EngineConfig(eos_token_ids=self.ckpt.tokens.eos, **engine), {}, speaks)
        engine = AREngine(self.model, worker.engine_config)
        worker.max_model_len, worker.engine = engine.max_model_len, engine
        return worker, engine


def hf_inputs(out) -> dict:
    """transformers' thinker inputs for the same prompt, features and patches."""
    ids = out["prompt"]["token_ids"]
    kwargs = dict(input_ids=torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    if "audio" in out:
        mels = [log_mel(c, 128) for c in out["audio"]["clips"]]
        width = max(m.shape[1] for m in mels)
        features = torch.zeros(len(mels), 128, width)
        mask = torch.zeros(len(mels), width, dtype=torch.long)
        for i, m in enumerate(mels):
            features[i, :, : m.shape[1]], mask[i, : m.shape[1]] = m, 1
        kwargs.update(input_features=features, feature_attention_mask=mask)
    if "vision" in out:
        kinds = [k for k in out["prompt"]["media"] if k != "audio"]
        grids, patches = out["vision"]["grids"], out["vision"]["patches"]
        sizes = [t * h * w for t, h, w in grids]
        pieces = patches.split(sizes)
        for kind, name in (("image", "pixel_values"), ("video", "pixel_values_videos")):
            chosen = [i for i, k in enumerate(kinds) if k == kind]
            if chosen:
                kwargs[name] = torch.cat([pieces[i] for i in chosen])
                kwargs[f"{kind}_grid_thw"] = torch.tensor([grids[i] for i in chosen])
        if "video" in kinds:
            kwargs["video_second_per_grid"] = torch.tensor([1.0] * kinds.count("video"))  # 2 frames at 2 fps
    return kwargs


def chats():
    audio = noise(3.3)
    return {
        "text": [{"role": "user", "content": [{"type": "text", "text": "Hello there, how are you?"}]}],
        "system+turns": [
            {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
            {"role": "user", "content": [{"type": "text", "text": "Tell me more."}]},
        ],
        "audio": [{"role": "user", "content": [{"type": "audio", "audio": audio}, {"type": "text", "text": "Transcribe the audio"}]}],
        "long-audio": [{"role": "user", "content": [{"type": "audio", "audio": noise(7.1, seed=3)}]}],
        "image": [{"role": "user", "content": [{"type": "image", "image": png(64, 96)}, {"type": "text", "text": "What is it?"}]}],
        "video": [{"role": "user", "content": [{"type": "video", "video": mp4()}, {"type": "text", "text": "What happens?"}]}],
        "mixed": [{"role": "user", "content": [
            {"type": "text", "text": "Look:"}, {"type": "image", "image": png(100, 40, seed=2)},
            {"type": "audio", "audio": audio[:20000]}, {"type": "image", "image": png(32, 32, seed=3)},
            {"type": "text", "text": "and?"},
        ]}],
        # the same token ids as "image" (an image of the same size): blocks must not be shared
        "other-image": [{"role": "user", "content": [{"type": "image", "image": png(64, 96, seed=5)}, {"type": "text", "text": "What is it?"}]}],
    }


@pytest.fixture(scope="module")
def stages(tiny_dir):
    return Stages(tiny_dir)


@pytest.fixture(scope="module")
def expected(stages, hf_thinker):
    """transformers' greedy tokens for each chat."""
    out = {}
    for name, messages in chats().items():
        inputs, _ = stages.inputs(messages)
        ids = hf_thinker.generate(**hf_inputs(inputs), max_new_tokens=NEW_TOKENS, do_sample=False,
                                  eos_token_id=list(stages.ckpt.tokens.eos), pad_token_id=0)
        out[name] = ids[0, len(inputs["prompt"]["token_ids"]) :].tolist()
    return out


def test_audio_encoder_equals_transformers(stages, hf_thinker):
    # shorter than a chunk, several windows (tiny preset: 2 chunks of 100 frames a window), a tail
    clips = [noise(0.31, seed=1), noise(4.77, seed=2), noise(1.0, seed=3)]
    mels = [log_mel(c, 128) for c in clips]
    ours = stages.audio.model(mels)
    ref = hf_thinker.model.audio_tower(input_features=torch.cat(mels, 1), feature_lens=torch.tensor([m.shape[1] for m in mels]))
    assert [o.shape[0] for o in ours] == [4, 62, 13]
    torch.testing.assert_close(torch.cat(ours), ref.last_hidden_state, atol=1e-5, rtol=1e-4)


def test_vision_encoder_equals_transformers(stages, hf_thinker):
    from omni_qwen3_omni.media import decode_video, fitted_size, frames_patches, image_patches

    v = stages.ckpt.vision
    frames, _ = decode_video(mp4(), 2.0, 8, lambda w, h: fitted_size(w, h, v, 3136, 16384))
    parts = [image_patches(png(64, 96), v), frames_patches(frames, v, 3136, 16384), image_patches(png(130, 77, seed=1), v)]
    patches, grids = torch.cat([p.pixels for p in parts]), [p.grid for p in parts]
    tokens, deep = stages.vision.model(patches, grids)
    ref = hf_thinker.model.visual(patches, grid_thw=torch.tensor(grids))
    torch.testing.assert_close(tokens, ref.pooler_output, atol=1e-5, rtol=1e-4)
    assert deep.shape[0] == len(ref.deepstack_features) == 2
    for ours, theirs in zip(deep, ref.deepstack_features, strict=True):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)


def test_prefill_logits_equal_transformers(stages, hf_thinker):
    out, joined = stages.inputs(chats()["mixed"])
    worker, engine = stages.worker(block_size=8)
    request = worker.make_request(Message("r", "*", joined))
    last = stages.model.kv_cache_spec.num_layers
    request.hidden_layers = (last,)  # the final norm's output at every prompt position
    request.params.max_tokens = 1
    engine.add_request(request)
    hidden = []
    while engine.has_unfinished():
        for o in engine.step():
            hidden.append(o.step_outputs["hidden_states"][last])
    ours = stages.model.compute_logits(torch.cat(hidden)[: len(out["prompt"]["token_ids"])])
    with torch.no_grad():
        ref = hf_thinker(**hf_inputs(out)).logits[0]
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def generate_together(stages, names, rounds: int = 1, **engine_config):
    """Each round submits every chat at once and steps until all finish; returns each round's tokens."""
    worker, engine = stages.worker(**engine_config)
    results = []
    for _ in range(rounds):
        tokens = {name: [] for name in names}
        for name in names:
            _, joined = stages.inputs(chats()[name], rid=name)
            engine.add_request(worker.make_request(Message(name, "*", joined)))
        while engine.has_unfinished():
            for o in engine.step():
                tokens[o.request_id] += o.new_token_ids
        results.append(tokens)
    return results, engine.stats()


CONFIGS = {
    "prefix-cache": dict(block_size=8),
    "no-prefix-cache": dict(block_size=8, enable_prefix_caching=False),
    # prompts prefilled in 24-token chunks (media rows and deepstack cut across chunks), and too few
    # blocks for every sequence: decode preempts and recomputes, media included
    "chunked+preempt": dict(block_size=8, max_num_batched_tokens=24, num_kv_blocks=32),
}


@pytest.mark.parametrize("config", list(CONFIGS))
def test_greedy_tokens_equal_transformers_generate(stages, expected, config):
    names = list(chats())
    assert len(names) == 8
    # with the prefix cache, a second round finds the first round's blocks (media prompts' under
    # their media's digest)
    rounds, stats = generate_together(stages, names, rounds=2 if config == "prefix-cache" else 1, **CONFIGS[config])
    for got in rounds:
        assert got == expected
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    if config == "prefix-cache":
        assert stats["prefix_cache_hit_tokens"] >= sum(len(stages.inputs(chats()[n])[0]["prompt"]["token_ids"]) // 8 * 8 for n in names) - 8 * len(names)
    if config == "chunked+preempt":
        assert stats["preemptions"] > 0


def test_checkpoint_with_other_special_ids(reordered_dir, tiny_dir):
    from transformers import Qwen3OmniMoeForConditionalGeneration

    stages = Stages(reordered_dir)
    usual = Stages.__new__(Stages)
    from omni_qwen3_omni.config import load_checkpoint

    usual.ckpt = load_checkpoint(tiny_dir)
    ids, other = usual.ckpt.tokens, stages.ckpt.tokens
    assert all(getattr(ids, f) != getattr(other, f) for f in ("audio", "image", "video", "audio_start", "vision_start"))
    hf = Qwen3OmniMoeForConditionalGeneration.from_pretrained(reordered_dir, dtype=torch.float32).eval().thinker
    for name in ("mixed", "video"):
        inputs, _ = stages.inputs(chats()[name])
        ref = hf.generate(**hf_inputs(inputs), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=list(other.eos), pad_token_id=0)
        (got,), _ = generate_together(stages, [name], block_size=8)
        assert got[name] == ref[0, len(inputs["prompt"]["token_ids"]) :].tolist(), name
