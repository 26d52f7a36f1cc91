"""Checkpoints whose weights are drawn in memory: the `full` preset (Qwen3-Omni-30B-A3B's sizes,
no safetensors written) and the same mechanism at tiny sizes, served end to end with speech."""

from __future__ import annotations

import numpy as np
import torch


def test_full_preset_has_the_real_sizes_and_writes_no_weights(tmp_path):
    from omni_core.hooks import get_plugin_manager
    from omni_qwen3_omni.config import load_checkpoint, load_tokenizer

    spec = get_plugin_manager().family("qwen3-omni")  # the preset as `omni serve --preset full` finds it
    path = spec.presets["full"](str(tmp_path / "full"))
    ckpt = load_checkpoint(path)
    assert ckpt.random_weights_std == 0.02 and not list(tmp_path.rglob("*.safetensors"))
    text, talker = ckpt.text_config, ckpt.config.talker_config
    assert (text.num_hidden_layers, text.hidden_size, text.num_experts, text.num_experts_per_tok, text.vocab_size) == (48, 2048, 128, 8, 152064)
    assert (ckpt.audio_config.encoder_layers, ckpt.audio_config.d_model, ckpt.vision_config.depth) == (32, 1280, 27)
    assert (talker.text_config.num_hidden_layers, talker.text_config.num_experts, talker.num_code_groups, talker.accept_hidden_layer) == (20, 128, 16, 24)
    assert ckpt.config.code2wav_config.decoder_dim == 1536
    # every id the thinker can sample decodes to text, the special ones are where the config says
    tokenizer = load_tokenizer(path)
    assert tokenizer.decode([300, 151000]) == " w300 w151000"
    assert tokenizer.convert_ids_to_tokens(ckpt.tokens.audio) == "<|audio_pad|>" and ckpt.tokens.audio >= 151643


def test_random_fill_draws_each_table_from_its_name():
    from omni_qwen3_omni.checkpoint import random_fill
    from omni_qwen3_omni.code2wav import LayerScale, SnakeBeta

    first, second = torch.nn.Embedding(64, 8), torch.nn.Embedding(64, 8)
    random_fill(first, "thinker.model.embed_tokens."), random_fill(second, "thinker.model.embed_tokens.")
    assert torch.equal(first.weight, second.weight) and abs(first.weight.std().item() - 0.02) < 0.005
    other = random_fill(torch.nn.Embedding(64, 8), "talker.")
    assert not torch.equal(first.weight, other.weight)
    norm, snake, scale = random_fill(torch.nn.LayerNorm(8)), random_fill(SnakeBeta(8)), random_fill(LayerScale(8))
    assert torch.all(norm.weight == 1) and torch.all(norm.bias == 0)
    assert torch.all(snake.alpha == 0) and torch.all(snake.beta == 0) and torch.all(scale.scale == 0.01)


def test_weights_in_memory_serve_a_chat_with_speech(tmp_path):
    from omni_core.api import Omni
    from omni_qwen3_omni.presets import SIZES, VOCAB_SIZE, write_in_memory

    path = write_in_memory(tmp_path / "tiny-in-memory", parts=SIZES, vocab_size=VOCAB_SIZE, regular_tokens=0, name="tiny")
    assert not list((tmp_path / "tiny-in-memory").glob("*.safetensors"))
    options = {"talker_temperature": 0, "talker_max_tokens": 12, "max_model_len": 512}
    with Omni("qwen3-omni", checkpoint_dir=path, device="cpu", options=options) as omni:
        result = omni.chat([{"role": "user", "content": "Hello there"}], modalities=("text", "audio"), voice="ethan",
                           sampling={"max_tokens": 6, "temperature": 0})
    assert result.sample_rate == 24000 and result.audio is not None
    assert result.audio.size >= 4 * 1920 and np.isfinite(result.audio).all() and np.abs(result.audio).max() > 0
    assert result.usage["completion_tokens"] == 6
