"""The CTranslate2 reader, the conversion to Hugging Face names, the tiny preset and log-mel features."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omni_whisper.checkpoint import CheckpointError, bundled_model_dir, load_checkpoint
from omni_whisper.ct2 import CT2FormatError, Unread, read_ct2_model
from omni_whisper.features import FRAMES_PER_WINDOW, log_mel, split_windows
from transformers import WhisperFeatureExtractor, WhisperForConditionalGeneration


def test_ct2_reader_reads_the_bundled_model():
    model = read_ct2_model(bundled_model_dir() / "model.bin")
    assert model.spec == "WhisperSpec"
    assert model["decoder/embeddings/weight"].shape == (51864, 384)
    assert model["decoder/embeddings/weight"].dtype == np.float16
    assert model["encoder/layer_3/self_attention/linear_0/weight"].shape == (3 * 384, 384)
    assert model.scalar("decoder/num_heads") == 6
    # the output projection is an alias of the token embedding
    assert model["decoder/projection/weight"] is model["decoder/embeddings/weight"]
    # the fused self-attention bias holds zeros where Whisper's key projection has none
    bias = model["encoder/layer_0/self_attention/linear_0/bias"]
    assert not bias[384:768].any() and bias[:384].any()


def test_ct2_reader_rejects_damaged_files(tmp_path):
    data = (bundled_model_dir() / "model.bin").read_bytes()
    truncated = tmp_path / "model.bin"
    truncated.write_bytes(data[:100_000])
    with pytest.raises(CT2FormatError, match="past the end|truncated"):
        read_ct2_model(truncated)
    wrong_version = tmp_path / "v99.bin"
    wrong_version.write_bytes((99).to_bytes(4, "little") + data[4:64])
    with pytest.raises(CT2FormatError, match="version 99"):
        read_ct2_model(wrong_version)
    with pytest.raises(CheckpointError):
        load_checkpoint(tmp_path)  # model.bin is not a Whisper model and nothing else is there


def test_configuration_without_the_weights(bundled_checkpoint, bundled_hf_dir, tmp_path):
    shapes = read_ct2_model(bundled_model_dir() / "model.bin", data=False)
    full = read_ct2_model(bundled_model_dir() / "model.bin")
    assert {k: tuple(v.shape) for k, v in shapes.variables.items()} == {k: v.shape for k, v in full.variables.items()}
    assert isinstance(shapes["decoder/embeddings/weight"], Unread) and shapes.scalar("decoder/num_heads") == 6
    for path in (bundled_model_dir(), bundled_hf_dir):
        light = load_checkpoint(path, weights=False)
        assert light.state_dict == {} and light.config.to_dict() == load_checkpoint(path).config.to_dict()
        assert (light.suppress_ids, light.begin_suppress_ids) == (bundled_checkpoint.suppress_ids, bundled_checkpoint.begin_suppress_ids)
    # the frontend stage reads no weight: it serves from a copy of the checkpoint that has none
    import shutil

    from omni_whisper.stages import Frontend

    bare = tmp_path / "bare"
    shutil.copytree(bundled_hf_dir, bare, ignore=shutil.ignore_patterns("*.safetensors"))
    sent = []
    Frontend(str(bare))(SimpleNamespace(payload={"audio": torch.zeros(16000), "language": "en"}), lambda *a, **k: sent.append(a))
    assert sent[0][0] == "mel" and sent[0][1]["mel"].shape == (1, 80, FRAMES_PER_WINDOW)
    with pytest.raises(CheckpointError, match="no \\*.safetensors"):
        load_checkpoint(bare)


def test_converted_weights_fill_transformers_whisper_exactly(bundled_checkpoint):
    config = bundled_checkpoint.config
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.vocab_size) == (384, 4, 4, 51864)
    reference = WhisperForConditionalGeneration(config)
    missing, unexpected = reference.load_state_dict(bundled_checkpoint.state_dict, strict=False)
    assert unexpected == []
    assert missing == ["proj_out.weight"]  # tied to the embedding, as in the original
    assert bundled_checkpoint.suppress_ids and bundled_checkpoint.begin_suppress_ids == [220, 50256]


def test_tiny_preset_is_a_hugging_face_checkpoint(tmp_path):
    from omni_whisper.presets import write_tiny

    path = write_tiny(str(tmp_path / "tiny"))
    assert write_tiny(path) == path  # idempotent
    checkpoint = load_checkpoint(path)
    assert checkpoint.config.d_model == 64 and checkpoint.config.vocab_size == 51864
    reference = WhisperForConditionalGeneration.from_pretrained(path)
    ours = checkpoint.state_dict["model.decoder.layers.1.fc1.weight"]
    assert torch.equal(reference.model.decoder.layers[1].fc1.weight, ours)


def test_log_mel_matches_whisper_feature_extractor(spoken_16k):
    extractor = WhisperFeatureExtractor()
    rng = np.random.default_rng(0)
    for audio in (spoken_16k[0], (0.1 * rng.standard_normal(16000 * 5)).astype(np.float32)):
        expected = extractor(audio, sampling_rate=16000, return_tensors="np").input_features
        windows, durations, offsets = split_windows(torch.from_numpy(audio))
        ours = log_mel(windows).numpy()
        assert ours.shape == (1, 80, FRAMES_PER_WINDOW)
        np.testing.assert_allclose(ours, expected, atol=1e-4)
        assert durations == [pytest.approx(len(audio) / 16000)] and offsets == [0.0]


def test_long_audio_splits_into_windows_of_at_most_30_seconds_cut_where_it_is_quiet():
    # even loudness everywhere: each window ends in its last 0.3 s
    windows, durations, offsets = split_windows(torch.ones(16000 * 65))
    assert windows.shape == (3, 16000 * 30)
    assert durations == [29.85, 29.85, 5.3] and offsets == [0.0, 29.85, 59.7]
    assert float(windows[2, int(16000 * 5.3) :].abs().sum()) == 0.0  # the last window is zero-padded
    # pauses 3-4 s before the 30 s marks: the cuts fall in them, and the windows hold all the audio
    audio = torch.randn(16000 * 65, generator=torch.Generator().manual_seed(0))
    audio[16000 * 26 : int(16000 * 26.4)] = 0
    audio[int(16000 * 52.5) : int(16000 * 52.9)] = 0.01
    windows, durations, offsets = split_windows(audio)
    assert 26.0 <= offsets[1] <= 26.4 and 52.5 <= offsets[2] <= 52.9 and sum(durations) == pytest.approx(65)
    for window, offset, duration in zip(windows, offsets, durations, strict=True):
        start = round(offset * 16000)
        assert torch.equal(window[: round(duration * 16000)], audio[start : start + round(duration * 16000)])


def test_tiny_preset_runs_through_the_pipeline(tmp_path):
    from omni_core.api import Omni

    noise = (0.1 * np.random.default_rng(1).standard_normal(32000)).astype(np.float32)
    with Omni(family="whisper", preset="tiny", cache_dir=str(tmp_path), options={"dtype": "float32"}) as omni:
        result = omni.transcribe(noise, 16000, timestamps=True)
    assert result.duration == pytest.approx(2.0) and result.language == "en"
    assert 1 <= result.usage["output_tokens"] <= 224  # random weights: any words, but it ends
    assert all(0.0 <= s["start"] <= s["end"] <= 2.0 for s in result.segments)


def test_prompt_tokens_drop_control_tokens(bundled_checkpoint):
    from omni_whisper.tokenizer import WhisperTokenizer

    tok = WhisperTokenizer(bundled_checkpoint.tokenizer_dir, bundled_checkpoint.config.vocab_size)
    prompt = tok.prompt("en", False, "Meeting notes <|endoftext|> <|notimestamps|> Friday", 223)
    assert prompt[0] == tok.sot_prev and prompt[-2:] == [tok.sot, tok.no_timestamps]
    assert all(t < tok.eot for t in prompt[1:-2]) and "Friday" in tok.decode(prompt)
    assert tok.prompt("en", True, None, 223) == [tok.sot]
    with pytest.raises(ValueError, match="English-only"):
        tok.check_language("de")
