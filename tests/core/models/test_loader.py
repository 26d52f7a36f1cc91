"""Checkpoint loading: shards, per-expert vs stacked expert tensors, clear errors."""

import json

import pytest
import torch
from omni_core.models import WeightLoadError, iter_safetensors, load_causal_lm, load_weights
from omni_core.models.registry import build_causal_lm
from safetensors.torch import load_file, save_file


def test_sharded_checkpoint_loads_like_a_single_file(hf_checkpoints, tmp_path):
    hf, path = hf_checkpoints["Qwen3MoeForCausalLM"]
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1
    single, sharded = load_causal_lm(path), load_causal_lm(tmp_path)
    for (name, a), (_, b) in zip(single.state_dict().items(), sharded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_stacked_expert_tensors_load_like_per_expert_ones(hf_checkpoints):
    _, path = hf_checkpoints["Qwen3MoeForCausalLM"]
    per_expert = dict(iter_safetensors(path))
    stacked = {k: v for k, v in per_expert.items() if ".experts." not in k}
    for layer in range(2):
        prefix = f"model.layers.{layer}.mlp.experts"
        experts = range(4)
        stacked[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([per_expert[f"{prefix}.{e}.gate_proj.weight"], per_expert[f"{prefix}.{e}.up_proj.weight"]]) for e in experts])
        stacked[f"{prefix}.down_proj"] = torch.stack([per_expert[f"{prefix}.{e}.down_proj.weight"] for e in experts])
    reference = load_causal_lm(path)
    model = build_causal_lm(reference.config)
    load_weights(model, stacked.items())
    for (name, a), (_, b) in zip(reference.state_dict().items(), model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_missing_unexpected_and_misshapen_keys_are_named(hf_checkpoints, tmp_path):
    _, path = hf_checkpoints["Qwen2ForCausalLM"]
    weights = load_file(str(path / "model.safetensors"))
    config = load_causal_lm(path).config
    missing = {k: v for k, v in weights.items() if k != "model.layers.1.self_attn.k_proj.bias"}
    with pytest.raises(WeightLoadError, match="qkv_proj.bias"):
        load_weights(build_causal_lm(config), missing.items())
    with pytest.raises(WeightLoadError, match="model.extra.weight"):
        load_weights(build_causal_lm(config), [*weights.items(), ("model.extra.weight", torch.zeros(2))])
    bad = dict(weights)
    bad["model.norm.weight"] = torch.zeros(3)
    with pytest.raises(WeightLoadError, match="model.norm.weight"):
        load_weights(build_causal_lm(config), bad.items())
    # a backbone inside a bigger checkpoint, under a prefix
    save_file({f"llm.model.{k}": v for k, v in weights.items()} | {"speech_embedding.weight": torch.zeros(4, 64)}, str(tmp_path / "family.safetensors"))
    model = build_causal_lm(config)
    load_weights(model, iter_safetensors(tmp_path), strip_prefix="llm.model.")
    assert torch.equal(model.model.norm.weight, weights["model.norm.weight"])
