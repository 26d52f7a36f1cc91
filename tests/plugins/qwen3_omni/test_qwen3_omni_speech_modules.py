"""The speech half's modules against transformers' Qwen3-Omni on the tiny preset's weights
(float32, CPU): the talker's prefill logits through the core engine, its projections, the code
predictor's greedy codes and their embedding sum, and code2wav's waveform, whole and decoded in
chunks with left context; and the code2wav stage's chunk schedule."""

from __future__ import annotations

import pytest
import torch
from omni_core.scheduler import AREngine, EngineConfig, EngineRequest, SamplingParams


@pytest.fixture(scope="module")
def hf_model(tiny_dir):
    from omni_qwen3_omni.config import quiet_transformers
    from transformers import Qwen3OmniMoeForConditionalGeneration

    with quiet_transformers():
        return Qwen3OmniMoeForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def ckpt(tiny_dir):
    from omni_qwen3_omni.config import load_checkpoint

    return load_checkpoint(tiny_dir)


def test_talker_prefill_logits_and_projections(ckpt, hf_model):
    from omni_qwen3_omni.checkpoint import load_talker

    model, projections = load_talker(ckpt, "cpu", torch.float32)
    cfg = hf_model.config.talker_config
    g = torch.Generator().manual_seed(0)
    thinker_rows = torch.randn(7, cfg.thinker_hidden_size, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(projections.text_projection(thinker_rows), hf_model.talker.text_projection(thinker_rows))
        torch.testing.assert_close(projections.hidden_projection(thinker_rows), hf_model.talker.hidden_projection(thinker_rows))
    length = 11
    embeds = torch.randn(length, cfg.text_config.hidden_size, generator=g)
    with torch.no_grad():
        ref = hf_model.talker(inputs_embeds=embeds[None], attention_mask=torch.ones(1, length, dtype=torch.long),
                              talker_input_ids=torch.zeros(1, length, dtype=torch.long)).logits[0]
    engine = AREngine(model, EngineConfig(block_size=8))
    last = model.kv_cache_spec.num_layers
    engine.add_request(EngineRequest("t", prompt_embeds=embeds, params=SamplingParams(temperature=0, max_tokens=1), hidden_layers=(last,)))
    rows = []
    while engine.has_unfinished():
        for out in engine.step():
            rows.append(out.step_outputs["hidden_states"][last])
    torch.testing.assert_close(model.compute_logits(torch.cat(rows)[:length]), ref, atol=1e-5, rtol=1e-5)


def test_code_predictor_greedy_codes(ckpt, hf_model):
    from omni_qwen3_omni.checkpoint import load_code_predictor

    ours = load_code_predictor(ckpt, "cpu", torch.float32)
    ref = hf_model.talker.code_predictor
    cfg = ref.config
    g = torch.Generator().manual_seed(1)
    hidden, code0 = torch.randn(4, cfg.hidden_size, generator=g), torch.randn(4, cfg.hidden_size, generator=g)
    codes, total = ours(hidden, code0)
    out = ref.generate(inputs_embeds=torch.stack([hidden, code0], 1), max_new_tokens=cfg.num_code_groups - 1, do_sample=False,
                       output_hidden_states=True, return_dict_in_generate=True)
    assert codes.tolist() == out.sequences.tolist()
    embedded = [step[0] for step in out.hidden_states[1:]] + [ref.get_input_embeddings()[-1](out.sequences[..., -1:])]
    torch.testing.assert_close(total, torch.cat(embedded, 1).sum(1))


def test_code2wav_whole_and_in_chunks(ckpt, hf_model):
    from omni_qwen3_omni.checkpoint import load_code2wav

    ours = load_code2wav(ckpt, "cpu", torch.float32)
    ref = hf_model.code2wav
    cfg = ref.config
    codes = torch.randint(0, cfg.codebook_size, (2, cfg.num_quantizers, 40), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(ours(codes), ref(codes))
        whole = ref.chunked_decode(codes, chunk_size=10, left_context_size=5)[:, 0]
    pieces, start = [], 0
    while start < codes.shape[-1]:
        end = min(start + 10, codes.shape[-1])
        context = min(5, start)
        pieces.append(ours.decode_chunk(codes[..., start - context : end], context))
        start = end
    torch.testing.assert_close(torch.cat(pieces, -1), whole)


def test_preset_weights_are_set_where_transformers_leaves_memory_uninitialised(tmp_path, monkeypatch):
    """transformers does not initialise the talker's stacked experts: the preset sets them itself
    (here every fresh tensor starts as NaN, as uninitialised memory sometimes is)."""
    from omni_qwen3_omni.presets import write_tiny
    from safetensors.torch import load_file

    empty = torch.empty

    def nan_empty(*args, **kwargs):
        t = empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", nan_empty)
    path = write_tiny(tmp_path / "preset")
    monkeypatch.undo()
    tensors = {k: v for f in sorted((tmp_path / "preset").glob("*.safetensors")) for k, v in load_file(f).items()}
    assert any(".experts." in k and k.startswith("talker.") for k in tensors)
    assert [k for k, v in tensors.items() if v.is_floating_point() and not torch.isfinite(v).all()] == []
    assert path == str(tmp_path / "preset")


def test_code2wav_stage_streams_chunks_and_applies_each_message_once(ckpt):
    """Frames arriving one a message: the first chunk after 4, then chunks as long as all decoded
    before them up to 25 (4, 8, 16, then 25), each with up to 25 frames of context, the rest at
    the end; the samples joined are the chunked decode's. A message seen
    again (a retried batch) adds nothing, and one for a released request makes no state."""
    from omni_core.scheduler.executor import Message
    from omni_qwen3_omni.checkpoint import load_code2wav
    from omni_qwen3_omni.code2wav_stage import Chunking, Code2WavWorker

    model = load_code2wav(ckpt, "cpu", torch.float32)
    worker = Code2WavWorker(model, Chunking(first_chunk=4, chunk=25, left_context=25))
    codes = torch.randint(0, model.codebook_size, (model.num_quantizers, 60), generator=torch.Generator().manual_seed(3))
    out = []

    def emit(rid, port, payload, end=False):
        out.append((payload["audio"], end))

    for t in range(60):
        message = Message("r", "in", {"codes": codes[:, t][None]}, end=t == 59, seq=t)
        worker.process([message], emit)
        if t == 10:
            worker.process([message], emit)  # seen again: nothing applied, nothing due
    expected = [model.decode_chunk(codes[None, :, max(0, a - 25) : b], min(25, a))[0] for a, b in ((0, 4), (4, 8), (8, 16), (16, 32), (32, 57), (57, 60))]
    assert [s.numel() for s, _ in out] == [e.numel() for e in expected] and out[-1][1]
    torch.testing.assert_close(torch.cat([s for s, _ in out]), torch.cat(expected))
    assert worker.requests == {}
    worker.process([Message("r", "in", {"codes": codes[:, 0][None]}, seq=60)], emit)  # after release
    assert worker.requests == {} and len(out) == 6
