"""Parity with transformers' Qwen3ASRForConditionalGeneration: the same random weights
(save_pretrained) loaded by both; features, encoder output, logits and greedy tokens compared."""

from __future__ import annotations

import json
import os
import shutil

import mlx.core as mx
import numpy as np
import pytest
import torch
from omni_qwen3_asr_mlx.config import audio_token_count
from omni_qwen3_asr_mlx.features import FeatureSettings, LogMel
from omni_qwen3_asr_mlx.frontend import Frontend
from omni_qwen3_asr_mlx.model import load_network
from omni_qwen3_asr_mlx.tokenizer import load_tokenizer
from safetensors.numpy import save_file
from transformers import Qwen3ASRFeatureExtractor, Qwen3ASRForConditionalGeneration

from .conftest import noise_audio


@pytest.fixture(scope="module")
def reference(tiny_dir):
    return Qwen3ASRForConditionalGeneration.from_pretrained(tiny_dir, dtype=torch.float32).eval()


def hf_features(audio):
    out = Qwen3ASRFeatureExtractor()(
        audio, sampling_rate=16000, padding=True, return_tensors="pt", return_attention_mask=True
    )  # padding=True: what Qwen3ASRProcessor passes
    return out["input_features"], out["attention_mask"]


@pytest.mark.parametrize("seconds", [0.3, 2.37, 12.5])
def test_features_and_encoder_match(tiny_dir, reference, seconds):
    audio = noise_audio(seconds, seed=3)
    features, mask = hf_features(audio)
    frames = int(mask.sum())
    ours = LogMel(FeatureSettings.from_dir(tiny_dir))(audio)
    assert ours.shape == (128, frames)
    np.testing.assert_allclose(ours, features[0, :, :frames].numpy(), atol=1e-4)

    with torch.no_grad():
        expected = reference.model.get_audio_features(features, mask).pooler_output.numpy()
    got = np.array(load_network(tiny_dir).encode(ours))
    assert got.shape == expected.shape == (audio_token_count(frames), reference.config.text_config.hidden_size)
    np.testing.assert_allclose(got, expected, atol=1e-4, rtol=1e-4)


def _prompt(tiny_dir, audio, language=None, context=""):
    payload = Frontend(tiny_dir, {}).prepare({"audio": audio, "language": language, "prompt": context})
    return payload["prompt_ids"][0], payload["mel"]


def test_logits_and_greedy_tokens_match(tiny_dir, reference):
    audio = noise_audio(3.1, seed=5)
    ids, mel = _prompt(tiny_dir, audio, context="glossary: omni")
    features, mask = hf_features(audio)
    network = load_network(tiny_dir)
    embeddings = network.prompt_embeddings(ids, network.encode(mel))
    ours = np.array(network.decoder(embeddings, network.decoder.new_cache(1), last_only=False))
    with torch.no_grad():
        expected = reference(
            input_ids=torch.tensor([ids]), input_features=features, input_features_mask=mask
        ).logits.numpy()
    assert ours.shape == expected.shape
    np.testing.assert_allclose(ours, expected, atol=2e-4, rtol=1e-4)

    steps = 24
    with torch.no_grad():
        generated = reference.generate(
            input_ids=torch.tensor([ids]), input_features=features, input_features_mask=mask,
            max_new_tokens=steps, do_sample=False, eos_token_id=None, pad_token_id=0,
        )[0, len(ids):].tolist()
    cache = network.decoder.new_cache(1)
    logits = network.decoder(embeddings, cache)
    tokens = []
    for _ in range(steps):
        token = int(mx.argmax(logits[0, -1]).item())
        tokens.append(token)
        logits = network.decoder(network.decoder.embed_tokens(mx.array([[token]])), cache)
    assert tokens == generated
    assert len(set(tokens)) > 1  # the tiny model's output is not a constant


def _to_original_layout(src: str, dst: str) -> None:
    """Rewrite a transformers-layout checkpoint in the original Qwen/Qwen3-ASR layout."""
    shutil.copytree(src, dst)
    weights = mx.load(os.path.join(src, "model.safetensors"))
    renamed = {}
    for key, value in weights.items():
        key = key.replace("model.multi_modal_projector.linear_1.", "thinker.audio_tower.proj1.")
        key = key.replace("model.multi_modal_projector.linear_2.", "thinker.audio_tower.proj2.")
        key = key.replace("model.audio_tower.", "thinker.audio_tower.")
        key = key.replace("model.language_model.", "thinker.model.")
        renamed[key] = np.array(value)
    if "lm_head.weight" not in weights:  # the original checkpoints store their head
        renamed["thinker.lm_head.weight"] = renamed["thinker.model.embed_tokens.weight"].copy()
    os.remove(os.path.join(dst, "model.safetensors"))
    save_file(renamed, os.path.join(dst, "model.safetensors"))
    with open(os.path.join(src, "config.json")) as f:
        config = json.load(f)
    thinker = {k: config.pop(k) for k in ("audio_config", "text_config", "audio_token_id")}
    thinker["audio_config"]["max_source_positions"] = 1500
    original = {"architectures": ["Qwen3ASRForConditionalGeneration"], "model_type": "qwen3_asr",
                "thinker_config": thinker, "eos_token_id": config["eos_token_id"]}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(original, f)


def _logits(checkpoint, ids, mel):
    network = load_network(checkpoint)
    embeddings = network.prompt_embeddings(ids, network.encode(mel))
    return np.array(network.decoder(embeddings, network.decoder.new_cache(1), last_only=False))


def test_original_layout_and_quantized_conversion_load(tiny_dir, tmp_path):
    audio = noise_audio(1.7, seed=9)
    ids, mel = _prompt(tiny_dir, audio, language="en")
    expected = _logits(tiny_dir, ids, mel)

    original = str(tmp_path / "original")
    _to_original_layout(tiny_dir, original)
    np.testing.assert_allclose(_logits(original, ids, mel), expected, atol=1e-5)

    # an MLX conversion: original names without 'thinker.', channels-last convolutions, 8-bit affine linears
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    network = load_network(original)
    nn.quantize(network, group_size=32, bits=8, class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[-1] % 32 == 0)
    names = {"audio_tower.": "audio_tower.", "projector.linear_1.": "audio_tower.proj1.",
             "projector.linear_2.": "audio_tower.proj2.", "decoder.lm_head.": "lm_head.", "decoder.": "model."}
    converted = {}
    for key, value in tree_flatten(network.parameters()):
        prefix = next(p for p in names if key.startswith(p))
        converted[names[prefix] + key[len(prefix):]] = value
    quantized = tmp_path / "quantized"
    shutil.copytree(original, quantized)
    os.remove(quantized / "model.safetensors")
    mx.save_safetensors(str(quantized / "model.safetensors"), converted)
    config = json.loads((quantized / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 8}
    (quantized / "config.json").write_text(json.dumps(config))
    got = _logits(str(quantized), ids, mel)
    assert np.abs(got - expected).max() < 0.05 * np.abs(expected).max()

    config["quantization"] = {"quant_method": "gptq", "bits": 4}
    (quantized / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="unsupported quantization"):
        load_network(str(quantized))


def test_tokenizer_and_features_come_from_the_checkpoint(tiny_dir, tmp_path):
    tokenizer = load_tokenizer(tiny_dir)
    assert tokenizer.convert_tokens_to_ids("<|audio_pad|>") == load_network(tiny_dir).config.audio_token_id
    broken = tmp_path / "no-config"
    broken.mkdir()
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_network(str(broken))


def test_half_precision_runs_in_its_dtype(tiny_dir):
    ids, mel = _prompt(tiny_dir, noise_audio(1.2, seed=2), language="en")
    reference = _logits(tiny_dir, ids, mel)
    network = load_network(tiny_dir, "bfloat16")
    audio = network.encode(mel)
    assert audio.dtype == mx.bfloat16
    logits = network.decoder(network.prompt_embeddings(ids, audio), network.decoder.new_cache(1), last_only=False)
    assert logits.dtype == mx.bfloat16
    # bfloat16 keeps ~2-3 significant digits: the top token of most positions survives
    agree = (np.array(mx.argmax(logits, axis=-1)) == reference.argmax(-1)).mean()
    assert agree > 0.8
    with pytest.raises(ValueError, match="unknown dtype"):
        load_network(tiny_dir, "int3")
