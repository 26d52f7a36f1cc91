"""Multimodal rotary positions (``EngineRequest.rope_positions``): a prompt's positions on several
axes reach the model, generated tokens continue one past the largest, and the result is the same
however the prompt is prefilled (whole, in chunks, recomputed after preemption)."""

import pytest
import torch
import transformers
from omni_core.models import random_causal_lm
from omni_core.models.layers import RotaryEmbedding, rotary_axes
from omni_core.scheduler import AREngine, EngineConfig, EngineRequest, SamplingParams

PROMPT = 20


@pytest.fixture(scope="module")
def mrope_model():
    """A Qwen3 with an interleaved multimodal rotary (sections [2, 3, 3] of a 16-wide head)."""
    config = transformers.Qwen3Config(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 3, 3], "interleaved": True},
    )
    config.architectures = ["Qwen3ForCausalLM"]
    model = random_causal_lm(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not name.endswith("norm.weight"):
                p.normal_(0, 0.1)
    return model


def grid_positions() -> torch.Tensor:
    """Text, a 3x4 grid sharing one time position, text after it one past the grid's largest."""
    text = torch.arange(4).expand(3, -1)
    t, h, w = torch.zeros(12, dtype=torch.long), torch.arange(3).repeat_interleave(4), torch.arange(4).repeat(3)
    grid = torch.stack([t, h, w]) + 4
    after = torch.arange(PROMPT - 16).expand(3, -1) + int(grid.max()) + 1
    return torch.cat([text, grid, after], dim=1)


def generate(model, requests, **config):
    engine = AREngine(model, EngineConfig(block_size=8, **config))
    out = {r.request_id: [] for r in requests}
    for r in requests:
        engine.add_request(r)
    while engine.has_unfinished():
        for o in engine.step():
            out[o.request_id] += o.new_token_ids
    stats = engine.stats()
    assert stats["kv_blocks_free"] == stats["kv_blocks_total"]
    return out, stats


def request(rid, positions=None, key=None, tokens=12):
    prompt = list(range(3, 3 + PROMPT))
    return EngineRequest(rid, prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True),
                         rope_positions=positions, prefix_key=key)


def test_equal_axes_are_plain_positions(mrope_model):
    plain, _ = generate(mrope_model, [request("a")])
    same, stats = generate(mrope_model, [request("a", torch.arange(PROMPT).expand(3, -1))])
    assert same == plain
    assert stats["prefix_cache_hit_tokens"] == 0


def test_rotary_table_takes_each_column_from_its_axis():
    rope = RotaryEmbedding(16, 64, 1e4, [2, 3, 3], interleaved=True)
    positions = torch.tensor([[5], [7], [9]])
    cos, _ = rope.table(positions, torch.float32)
    axes = rotary_axes(8, [2, 3, 3], True)
    # h at 1, 4, 7 (below 3 x 3), w at 2, 5 (8 is past the head), time elsewhere: as transformers' Qwen3-Omni
    assert axes.tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    expected = torch.cat([rope.cos[[5, 7, 9, 5, 7, 9, 5, 7], torch.arange(8)]] * 2)
    torch.testing.assert_close(cos[0, 0], expected)


def test_grid_positions_whole_chunked_and_recomputed(mrope_model):
    positions = grid_positions()
    assert int(positions.max()) + 1 - PROMPT < 0  # generated tokens continue below their index
    whole, _ = generate(mrope_model, [request("g", positions)])
    plain, _ = generate(mrope_model, [request("g")])
    assert whole != plain  # the positions reach the model
    batch = [request(f"g{i}", positions) for i in range(4)] + [request(f"p{i}") for i in range(4)]
    # 8-token prefill chunks, and too few blocks for all: preemption recomputes with the same positions
    together, stats = generate(mrope_model, batch, max_num_batched_tokens=8, num_kv_blocks=14)
    assert stats["preemptions"] > 0
    assert all(together[f"g{i}"] == whole["g"] for i in range(4))
    assert all(together[f"p{i}"] == plain["g"] for i in range(4))


def test_prefix_cache_only_under_a_key(mrope_model):
    positions = grid_positions()
    engine = AREngine(mrope_model, EngineConfig(block_size=8))
    for rid, key in (("a", None), ("b", None), ("c", "grid"), ("d", "grid")):
        engine.add_request(request(rid, positions, key, tokens=2))
        while engine.has_unfinished():
            engine.step()
    assert engine.stats()["prefix_cache_hit_tokens"] == 16  # d reused c's two full blocks; a and b nothing


def test_positions_past_the_model_are_refused(mrope_model):
    engine = AREngine(mrope_model, EngineConfig(block_size=8))
    far = torch.arange(PROMPT).expand(3, -1) + 500
    with pytest.raises(ValueError, match="rotary positions"):
        engine.add_request(request("far", far))
    with pytest.raises(ValueError, match="rope_positions must be"):
        engine.add_request(request("bad", torch.arange(PROMPT - 1)))


def test_axes_must_match_the_model(mrope_model, tiny_model):
    engine = AREngine(mrope_model, EngineConfig(block_size=8))
    with pytest.raises(ValueError, match="2 axes"):
        engine.add_request(request("two", torch.arange(PROMPT).expand(2, -1)))
    plain = AREngine(tiny_model, EngineConfig(block_size=8))  # one-axis rotary
    with pytest.raises(ValueError, match="3 axes"):
        plain.add_request(EngineRequest("m", prompt_token_ids=list(range(3, 3 + PROMPT)), rope_positions=grid_positions()))


def test_a_last_prompt_token_prefilled_alone_takes_its_own_position(mrope_model):
    """After a prefix-cache hit only the prompt's last token is prefilled, in a step of one token a
    sequence; where that token is inside a grid its position is not its index plus the offset."""
    length = 17
    text = torch.arange(5).expand(3, -1)
    grid = torch.stack([torch.zeros(12, dtype=torch.long), torch.arange(3).repeat_interleave(4), torch.arange(4).repeat(3)]) + 5
    positions = torch.cat([text, grid], dim=1)  # the last token is the grid's last cell: (5, 7, 8), not 8 on every axis
    prompt = list(range(3, 3 + length))
    engine = AREngine(mrope_model, EngineConfig(block_size=8))
    tokens = {}
    for rid in ("first", "second"):
        engine.add_request(EngineRequest(rid, prompt_token_ids=prompt, rope_positions=positions, prefix_key="grid",
                                         params=SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)))
        tokens[rid] = []
        while engine.has_unfinished():
            for out in engine.step():
                tokens[rid] += out.new_token_ids
    assert engine.stats()["prefix_cache_hit_tokens"] == 16
    assert tokens["second"] == tokens["first"]
