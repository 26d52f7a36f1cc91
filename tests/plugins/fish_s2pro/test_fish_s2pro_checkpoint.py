"""The slow and fast ARs loaded from a checkpoint written under the official key names (fused
``wqkv``, interleaved rotary pairs), against a plain reference forward written here from the
architecture's description, on the raw tensors of the file."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
import torch.nn.functional as F
from omni_core.models import WeightLoadError
from omni_core.scheduler.engine import AREngine, EngineConfig, EngineRequest
from omni_core.scheduler.sampling_params import SamplingParams
from omni_fish_s2pro.checkpoint import load_fast_ar, load_slow_ar
from omni_fish_s2pro.config import load_config, parse_config, token_ids
from safetensors.torch import load_file, save_file


def _rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _rotate_pairs(x, positions, base):
    """Interleaved rotary: dimensions (2j, 2j + 1) turn by position * base^(-2j / d)."""
    d = x.shape[-1]
    angle = positions[:, None].float() * base ** (-torch.arange(0, d, 2).float() / d)
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, odd * cos + even * sin], dim=-1).flatten(-2)


def _reference_layers(t, prefix, sizes, x, base, eps):
    """Layers named ``prefix``layers.N.* over x [T, D] (one sequence, causal)."""
    n, kv, hd = sizes.n_head, sizes.n_local_heads, sizes.head_dim
    positions = torch.arange(x.shape[0])
    for i in range(sizes.n_layer):
        p = f"{prefix}layers.{i}."
        h = _rms(x, t[p + "attention_norm.weight"], eps)
        q, k, v = (h @ t[p + "attention.wqkv.weight"].T).split([n * hd, kv * hd, kv * hd], dim=-1)
        q, k, v = q.view(-1, n, hd), k.view(-1, kv, hd), v.view(-1, kv, hd)
        if sizes.qk_norm:
            q, k = (
                _rms(q, t[p + "attention.q_norm.weight"], eps),
                _rms(k, t[p + "attention.k_norm.weight"], eps),
            )
        q, k = _rotate_pairs(q, positions, base), _rotate_pairs(k, positions, base)
        k, v = k.repeat_interleave(n // kv, dim=1), v.repeat_interleave(n // kv, dim=1)
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
        )
        x = x + out.transpose(0, 1).reshape(x.shape[0], -1) @ t[p + "attention.wo.weight"].T
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        x = (
            x
            + (F.silu(h @ t[p + "feed_forward.w1.weight"].T) * (h @ t[p + "feed_forward.w3.weight"].T))
            @ t[p + "feed_forward.w2.weight"].T
        )
    return _rms(x, t[prefix + "norm.weight"], eps)


@pytest.fixture(scope="module")
def tensors(tiny_dir):
    return load_file(f"{tiny_dir}/model.safetensors")


def test_config_reads_the_official_fields(tiny_dir):
    cfg = load_config(tiny_dir)
    assert (cfg.num_codebooks, cfg.codebook_size, cfg.sample_rate) == (10, 64, 44100)
    assert cfg.slow.qk_norm and not cfg.fast.qk_norm
    raw = json.loads(open(f"{tiny_dir}/config.json").read())
    # sizes the fast AR leaves out are the slow AR's, as the reference reads them
    raw["audio_decoder_config"] = {"vocab_size": 64, "num_codebooks": 10, "n_layer": 1}
    fast = parse_config(raw).fast
    assert (fast.dim, fast.n_head, fast.head_dim, fast.qk_norm) == (64, 4, 16, True)
    # and the slow AR's, the reference's defaults: head_dim 64, an FFN of 8/3 the width rounded up to 256
    raw["text_config"] = {
        k: v for k, v in raw["text_config"].items() if k not in ("head_dim", "intermediate_size")
    }
    slow = parse_config(raw).slow
    assert (slow.head_dim, slow.intermediate_size) == (64, 256)
    with pytest.raises(ValueError, match="fish_qwen3_omni"):
        parse_config({**raw, "model_type": "dual_ar"})


def test_slow_ar_matches_the_reference_forward_on_a_prompt_with_frames(tiny_dir, tensors):
    cfg, ids = load_config(tiny_dir), token_ids(tiny_dir, 64)
    slow = load_slow_ar(tiny_dir)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor(
        [ids.im_start, 80, 81, 82]
        + [ids.semantic_begin + c for c in (5, 9, 63)]
        + [ids.im_end, 90, ids.voice]
    )
    is_frame = (prompt >= ids.semantic_begin) & (prompt <= ids.semantic_end)
    codes = torch.randint(0, cfg.codebook_size, (prompt.numel(), cfg.num_codebooks), generator=gen)
    codes[is_frame, 0] = prompt[is_frame] - ids.semantic_begin

    x = tensors["text_model.model.embeddings.weight"][prompt].clone()
    table = tensors["audio_decoder.codebook_embeddings.weight"]
    summed = table[codes + torch.arange(cfg.num_codebooks) * cfg.codebook_size].sum(1)
    x[is_frame] = (x[is_frame] + summed[is_frame]) / math.sqrt(cfg.num_codebooks + 1)
    expected = _reference_layers(tensors, "text_model.model.", cfg.slow, x, cfg.rope_base, cfg.norm_eps)

    engine = AREngine(slow, EngineConfig(block_size=4, num_kv_blocks=64))
    embeds = slow.prompt_embeds(prompt, codes, is_frame)
    engine.add_request(
        EngineRequest(
            "r",
            prompt_embeds=embeds,
            params=SamplingParams(temperature=0, max_tokens=1),
            prompt_hidden_layers=(cfg.slow.n_layer,),
        )
    )
    outputs = [o for _ in range(4) if engine.has_unfinished() for o in engine.step()]
    hidden = outputs[0].step_outputs["hidden_states"][cfg.slow.n_layer]
    torch.testing.assert_close(hidden, expected, atol=2e-5, rtol=1e-4)

    logits = slow.compute_logits(hidden[-1:])[0]
    allowed = torch.isfinite(logits).nonzero().squeeze(1).tolist()
    assert allowed == list(range(ids.semantic_begin, ids.semantic_end + 1)) + [ids.im_end] or allowed == [
        ids.im_end
    ] + list(range(ids.semantic_begin, ids.semantic_end + 1))
    torch.testing.assert_close(
        logits[allowed],
        (expected[-1] @ tensors["text_model.model.embeddings.weight"].T)[allowed],
        atol=2e-5,
        rtol=1e-4,
    )


def test_fast_ar_matches_the_reference_greedy_codes(tiny_dir, tensors):
    cfg = load_config(tiny_dir)
    fast = load_fast_ar(tiny_dir)
    gen = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, cfg.slow.dim, generator=gen)
    code0 = torch.tensor([3, 0, 63])
    got = fast(hidden, code0)
    assert got.shape == (3, cfg.num_codebooks) and torch.equal(got[:, 0], code0)
    emb, out = tensors["audio_decoder.embeddings.weight"], tensors["audio_decoder.output.weight"]
    for row in range(3):
        sequence, codes = [hidden[row], emb[code0[row]]], [int(code0[row])]
        for _ in range(1, cfg.num_codebooks):
            h = _reference_layers(
                tensors, "audio_decoder.", cfg.fast, torch.stack(sequence), cfg.rope_base, cfg.norm_eps
            )
            codes.append(int((h[-1] @ out.T).argmax()))
            sequence.append(emb[codes[-1]])
        assert got[row].tolist() == codes


def test_a_key_the_model_lacks_is_named(tiny_dir, tensors, tmp_path):
    for name in ("config.json", "tokenizer.json", "codec.pth"):
        shutil.copy(f"{tiny_dir}/{name}", tmp_path / name)
    broken = dict(tensors)
    broken["text_model.model.layers.0.attention.wq.weight"] = broken.pop(
        "text_model.model.layers.0.attention.wqkv.weight"
    )[:64]
    save_file(broken, str(tmp_path / "model.safetensors"))
    with pytest.raises((KeyError, WeightLoadError), match="attention.wq"):
        load_slow_ar(str(tmp_path))
