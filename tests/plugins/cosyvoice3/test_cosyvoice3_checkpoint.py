"""The official layout at tiny size: key names, loading, a save -> load round trip with identical
outputs, the llm on the core AR engine against transformers' Qwen2 on the same weights, and the
RAS/length hooks inside the engine."""

from __future__ import annotations

import shutil

import pytest
import torch
from omni_core.scheduler.engine import AREngine, EngineConfig, EngineRequest
from omni_core.scheduler.executor import Message
from omni_core.scheduler.hooks import StepBatch
from omni_cosyvoice3.checkpoint import CheckpointError, load_flow, load_hift, load_llm, qwen_config
from omni_cosyvoice3.flow import FlowRequest
from omni_cosyvoice3.llm_stage import RasHooks, SpeechTokenWorker
from transformers import AutoConfig, Qwen2ForCausalLM

OFFICIAL_KEYS = {
    "llm.pt": [
        "llm.model.model.embed_tokens.weight",
        "llm.model.model.layers.0.self_attn.q_proj.bias",
        "llm.model.model.layers.1.mlp.gate_proj.weight",
        "llm.model.lm_head.weight",
        "speech_embedding.weight",
        "llm_decoder.weight",
    ],
    "flow.pt": [
        "input_embedding.weight",
        "spk_embed_affine_layer.weight",
        "pre_lookahead_layer.conv1.weight",
        "decoder.estimator.time_embed.time_mlp.0.weight",
        "decoder.estimator.input_embed.proj.weight",
        "decoder.estimator.input_embed.conv_pos_embed.conv1.0.weight",
        "decoder.estimator.rotary_embed.inv_freq",
        "decoder.estimator.transformer_blocks.1.attn.to_out.0.weight",
        "decoder.estimator.transformer_blocks.0.ff.ff.0.0.weight",
        "decoder.estimator.norm_out.linear.weight",
        "decoder.estimator.proj_out.weight",
    ],
    "hift.pt": [
        "conv_pre.parametrizations.weight.original0",
        "conv_pre.parametrizations.weight.original1",
        "ups.2.parametrizations.weight.original1",
        "source_downs.0.weight",
        "source_resblocks.2.convs1.0.parametrizations.weight.original0",
        "resblocks.8.activations2.2.alpha",
        "conv_post.bias",
        "m_source.l_linear.weight",
        "f0_predictor.condnet.8.parametrizations.weight.original1",
        "f0_predictor.classifier.weight",
    ],
}


def test_files_use_official_key_names(tiny_dir):
    for name, keys in OFFICIAL_KEYS.items():
        state = torch.load(f"{tiny_dir}/{name}", map_location="cpu", weights_only=True)
        assert set(keys) <= set(state), (name, sorted(set(keys) - set(state)))
    llm = torch.load(f"{tiny_dir}/llm.pt", weights_only=True)
    assert llm["speech_embedding.weight"].shape == (6761, 64) and llm["llm_decoder.weight"].shape == (
        6761,
        64,
    )


def test_round_trip_save_load_identical(tiny_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_dir, copy)
    flow, hift = load_flow(tiny_dir), load_hift(tiny_dir)
    torch.save(flow.state_dict(), copy / "flow.pt")  # our modules write the official names back
    torch.save(hift.state_dict(), copy / "hift.pt")
    flow2, hift2 = load_flow(copy), load_hift(copy)
    request = FlowRequest(torch.arange(40) * 97 % 6561, 5, torch.randn(10, 80), torch.randn(192), True, True)
    assert torch.equal(flow.infer([request])[0], flow2.infer([request])[0])
    mel = torch.randn(1, 80, 20) - 3
    assert torch.equal(hift(mel), hift2(mel))
    # a damaged file is refused with the key it lacks
    state = torch.load(copy / "hift.pt", weights_only=True)
    del state["conv_post.bias"]
    torch.save(state, copy / "hift.pt")
    with pytest.raises(CheckpointError, match="conv_post.bias"):
        load_hift(copy)
    (copy / "flow.pt").unlink()
    with pytest.raises(CheckpointError, match="flow.pt"):
        load_flow(copy)


class _Capture(RasHooks):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.logits = []

    def post_prefill(self, batch: StepBatch, hidden, logits, token_ids):
        self.logits.append(logits.clone())


def test_llm_on_engine_matches_transformers_qwen2(tiny_dir):
    model = load_llm(tiny_dir)
    hooks = _Capture(model.cfg)
    engine = AREngine(model, EngineConfig(num_kv_blocks=64, block_size=16, cuda_graphs=False), hooks=hooks)
    text_ids = [5, 17, 3, 40, 41, 42, 9]
    prompt_speech = [11, 6000, 345]
    embeds = model.prompt_embeds(text_ids, prompt_speech)
    ras = {"top_p": 0.8, "top_k": 25, "temperature": 1.0, "seed": 1, "min_tokens": 0}
    engine.add_request(EngineRequest("r", prompt_embeds=embeds, extras={"ras": ras}))
    engine.step()
    # reference: the same llm.pt loaded into transformers' Qwen2 (official names, unfused)
    state = torch.load(f"{tiny_dir}/llm.pt", weights_only=True)
    reference = Qwen2ForCausalLM(AutoConfig.from_pretrained(f"{tiny_dir}/CosyVoice-BlankEN")).eval()
    reference.load_state_dict(
        {k[len("llm.model.") :]: v for k, v in state.items() if k.startswith("llm.model.")}
    )
    with torch.no_grad():
        hidden = reference.model(inputs_embeds=embeds[None]).last_hidden_state[0, -1]
        expected = hidden @ state["llm_decoder.weight"].T
    torch.testing.assert_close(hooks.logits[0][0], expected, atol=1e-4, rtol=1e-4)
    sos, task = state["speech_embedding.weight"][6561], state["speech_embedding.weight"][6563]
    assert torch.equal(embeds[0], sos) and torch.equal(embeds[1 + len(text_ids)], task)


def _run(worker: SpeechTokenWorker, payloads: dict[str, dict]) -> dict[str, list[int]]:
    engine = AREngine(worker.model, worker.engine_config, hooks=worker.hooks)
    for rid, payload in payloads.items():
        engine.add_request(worker.make_request(Message(rid, "in", payload)))
    out: dict[str, list[int]] = {rid: [] for rid in payloads}
    while engine.has_unfinished():
        for result in engine.step():
            out[result.request_id].extend(result.new_token_ids)
    return out


def test_speech_token_worker_limits_and_seeds(tiny_dir):
    model = load_llm(tiny_dir)
    worker = SpeechTokenWorker(
        model, EngineConfig(num_kv_blocks=256, block_size=16, cuda_graphs=False, max_num_seqs=8)
    )
    base = {
        "text_ids": [5, 6, 7, 8, 3, 20, 21, 22],
        "target_text_len": 4,
        "llm_prompt_tokens": [],
        "sampling": {},
    }
    runs = _run(worker, {f"s{i}": dict(base, seed=i % 2) for i in range(4)})
    for tokens in runs.values():
        speech = [t for t in tokens if t < 6561]
        assert len(speech) >= 8 or tokens[-1] != 6561  # min 2 x text tokens: no 6561 before it
        assert len(tokens) <= 80  # max 20 x text tokens
        assert all(t < 6561 for t in tokens[:-1])  # only the last token may be a stop token
    # the seed decides the draws whatever shares the batch
    assert runs["s0"] == runs["s2"] and runs["s1"] == runs["s3"]
    alone = _run(worker, {"x": dict(base, seed=0)})
    assert alone["x"] == runs["s0"]
    with pytest.raises(ValueError, match="unknown sampling options"):
        worker.make_request(Message("bad", "in", dict(base, sampling={"beam": 3})))


def test_the_minimum_length_blocks_6561_alone_or_every_stop_id(tiny_dir):
    """As the reference: under its minimum a request cannot draw 6561, but the other ids past the
    codebook (the trained end token 6562 among them) still end it; ``block_all_stops`` blocks
    them all. Logits are crafted so that one stop id always wins where it may."""
    model = load_llm(tiny_dir)
    base = {"text_ids": [5, 6, 7, 8, 3, 20, 21, 22], "target_text_len": 4, "llm_prompt_tokens": [], "sampling": {}, "seed": 0}
    heads = model.compute_logits
    try:
        for favoured, block_all, expected_len in ((6561, False, 9), (6562, False, 1), (6562, True, 9)):
            bias = torch.zeros(6761)
            bias[6561:] = -1e4  # no other id past the codebook competes with the favoured one
            bias[favoured] = 50.0
            model.compute_logits = lambda hidden, bias=bias: heads(hidden) + bias
            worker = SpeechTokenWorker(model, EngineConfig(num_kv_blocks=256, block_size=16, cuda_graphs=False), block_all)
            tokens = _run(worker, {"r": base})["r"]
            # blocked until the minimum (2 x 4 text tokens), then drawn at once; not blocked: at once
            assert len(tokens) == expected_len and tokens[-1] == favoured and max(tokens[:-1], default=0) < 6561
    finally:
        model.compute_logits = heads
    from omni_cosyvoice3.topology import build

    with pytest.raises(ValueError, match="min_length_blocks='some'"):
        build(tiny_dir, {"min_length_blocks": "some"})


def test_silent_and_breath_codes_past_five_in_a_row_do_not_reach_the_flow(tiny_dir):
    """As the reference's llm job: a run of silent/breath codes keeps its first five, counted
    across steps, and starts again after any other code."""
    worker = SpeechTokenWorker(load_llm(tiny_dir), EngineConfig(num_kv_blocks=64, block_size=16, cuda_graphs=False))
    payload = {"text_ids": [5, 6, 7], "target_text_len": 3, "llm_prompt_tokens": [], "sampling": {}, "seed": 0, "streaming": False}
    worker.make_request(Message("r", "in", payload))
    sent = []
    steps = [[100], [1, 2, 28], [29, 55, 248, 494], [300, 2241], [2242] * 3, [2322] * 3, [6562]]
    for i, tokens in enumerate(steps):
        worker.on_output("r", tokens, i == len(steps) - 1, {}, lambda port, p, end=False: sent.append((p["token_ids"], end)))
    assert sent == [([100, 1, 2, 28, 29, 55, 300, 2241, 2242, 2242, 2242, 2322], True)]


def test_ras_decode_overlapped_gives_the_step_by_step_tokens(tiny_dir):
    # RAS reads the recent tokens through batch.recent_tokens, so the llm's decode steps may be
    # launched before the previous step's tokens reach the host: the draws must not change
    model = load_llm(tiny_dir)
    base = {"text_ids": [5, 6, 7, 8, 3, 20, 21, 22], "target_text_len": 4, "llm_prompt_tokens": [], "sampling": {}}
    # seeds and counts decide the draws (the window's reading of the token in flight is checked
    # in tests/core/engine/test_overlap_decode.py)
    payloads = {f"s{i}": dict(base, seed=i, sampling={"top_k": 1 + 10 * i}) for i in range(4)}
    runs = {}
    for overlap in (False, True):
        config = EngineConfig(num_kv_blocks=256, block_size=16, cuda_graphs=False, max_num_seqs=8, overlap_decode=overlap)
        worker = SpeechTokenWorker(model, config)
        assert AREngine(model, config, hooks=worker.hooks).overlap_decode == overlap
        runs[overlap] = _run(worker, payloads)
    assert runs[True] == runs[False]
    assert len({tuple(tokens) for tokens in runs[True].values()}) == 4
    # the build option reaches the llm's engine (off unless asked for)
    from types import SimpleNamespace

    from omni_cosyvoice3.topology import build

    for options, expected in (({}, False), ({"llm_overlap_decode": True}, True)):
        llm = next(stage for stage in build(tiny_dir, options).stages if stage.name == "llm")
        assert llm.factory(SimpleNamespace(device=torch.device("cpu"))).engine_config.overlap_decode is expected


def test_tiny_preset_has_the_backbone_files_a_real_checkpoint_has(tiny_dir):
    """CosyVoice-BlankEN holds the pretrained backbone the official code builds its llm from
    (model.safetensors, the same tensors llm.pt carries under llm.model.) and a config.json whose
    rotary base both transformers 4 (rope_theta) and 5 (rope_parameters) read."""
    import json

    from safetensors.torch import load_file

    blank = f"{tiny_dir}/CosyVoice-BlankEN"
    backbone = load_file(f"{blank}/model.safetensors")
    llm = torch.load(f"{tiny_dir}/llm.pt", weights_only=True)
    assert backbone.keys() == {k[len("llm.model.") :] for k in llm if k.startswith("llm.model.")}
    assert all(torch.equal(v, llm[f"llm.model.{k}"]) for k, v in backbone.items())
    raw = json.loads(open(f"{blank}/config.json").read())
    assert raw["rope_theta"] == raw["rope_parameters"]["rope_theta"] == 1e6
    assert qwen_config(tiny_dir).rope_parameters["rope_theta"] == 1e6
