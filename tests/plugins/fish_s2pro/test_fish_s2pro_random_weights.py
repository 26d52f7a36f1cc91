"""Checkpoints whose weights are drawn at load: the ``full`` preset's files (published sizes and
token ids, no weights written) and a small one of the same kind served end to end."""

from __future__ import annotations

import json

import numpy as np
from omni_core.api import Omni
from omni_fish_s2pro.checkpoint import check_layout, load_fast_ar
from omni_fish_s2pro.config import load_config, token_ids
from omni_fish_s2pro.presets import (
    AUDIO_DECODER_CONFIG,
    CODEC_SIZES,
    TEXT_CONFIG,
    tiny_tokenizer,
    write_full,
    write_random,
)


def test_the_full_preset_has_the_published_sizes_and_ids_and_no_weights(tmp_path):
    path = write_full(str(tmp_path / "full"))
    check_layout(path)
    assert not list(tmp_path.glob("full/*.safetensors")) and not (tmp_path / "full" / "codec.pth").exists()
    cfg = load_config(path)
    assert (cfg.slow.n_layer, cfg.slow.dim, cfg.slow.n_head, cfg.slow.n_local_heads, cfg.slow.head_dim) == (
        36,
        2560,
        32,
        8,
        128,
    )
    assert (cfg.fast.n_layer, cfg.fast.qk_norm, cfg.vocab_size, cfg.num_codebooks, cfg.codebook_size) == (
        4,
        False,
        155776,
        10,
        4096,
    )
    ids = token_ids(path, cfg.codebook_size)
    assert (ids.semantic_begin, ids.semantic_end, ids.im_start, ids.im_end) == (
        151678,
        155773,
        151644,
        151645,
    )
    raw = json.loads((tmp_path / "full" / "config.json").read_text())
    assert (raw["semantic_start_token_id"], raw["semantic_end_token_id"]) == (151678, 155773)


def test_a_random_checkpoint_serves_and_draws_the_same_weights_each_load(tmp_path):
    path = write_random(
        str(tmp_path / "small"), "small", TEXT_CONFIG, AUDIO_DECODER_CONFIG, tiny_tokenizer(), CODEC_SIZES
    )
    first, second = load_fast_ar(path), load_fast_ar(path)
    assert all(
        np.array_equal(a.numpy(), b.numpy())
        for a, b in zip(first.state_dict().values(), second.state_dict().values(), strict=True)
    )
    with Omni("fish-s2pro", checkpoint_dir=path, device="cpu", options={"max_new_tokens": 6}) as omni:
        audio = omni.speech("Hello.", "default", seed=1).audio
    assert 0 < len(audio) <= 6 * 2048 and len(audio) % 2048 == 0
