"""The fused MoE kernels (routing, per-pair and grouped expert paths) against the torch path.

They run where Triton can: on CPU tensors in float32 under ``TRITON_INTERPRET=1`` (the suite
does that in a subprocess, see test_backend_selection.py) and on CUDA in bfloat16."""

import pytest
import torch

from tests.helpers.triton_target import DEVICE, DTYPE, TOL, requires_triton_target

pytestmark = requires_triton_target


def _moe(hidden=64, experts=8, top_k=2, inter=48, shared=0, seed=0):
    from omni_core.models.moe import SparseMoeBlock

    torch.manual_seed(seed)
    block = SparseMoeBlock(hidden, experts, top_k, inter, norm_topk_prob=True, shared_intermediate=shared)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.1)
    return block.to(DEVICE, DTYPE)


def _torch_reference(block, x):
    probs = torch.softmax(block.gate(x), dim=-1, dtype=torch.float32)
    weights, ids = torch.topk(probs, block.top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    return ids, weights, block.experts(x, ids, weights.to(x.dtype))


@pytest.mark.parametrize("tokens", [1, 5, 40])
def test_route_picks_the_top_experts(tokens):
    from omni_core.models.kernels import fused_moe

    block = _moe(experts=16, top_k=4)
    x = torch.randn(tokens, 64, device=DEVICE, dtype=DTYPE)
    ids, weights = fused_moe.route(x, block.gate.weight, 4, True)
    ref_ids, ref_weights, _ = _torch_reference(block, x)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(weights, ref_weights, **TOL[DTYPE])


@pytest.mark.parametrize("tokens", [1, 3, 32, 100])  # 2-6 pairs per token: per-pair kernels up to 64 pairs, grouped above
def test_experts_equal_the_torch_path(tokens):
    from omni_core.models.kernels import fused_moe

    block = _moe()
    x = torch.randn(tokens, 64, device=DEVICE, dtype=DTYPE)
    ids, weights, expected = _torch_reference(block, x)
    got = fused_moe.experts_forward(x, block.experts.gate_up_proj, block.experts.down_proj, ids.int(), weights)
    torch.testing.assert_close(got, expected, **TOL[DTYPE])


def test_align_sorts_pairs_into_whole_blocks_per_expert():
    from omni_core.models.kernels import fused_moe

    ids = torch.tensor([[3, 0], [3, 1], [0, 3], [5, 3]], device=DEVICE)
    rows, block_expert, used = fused_moe.align(ids, num_experts=8, block_m=4)
    flat = ids.reshape(-1).tolist()
    assert used.item() == 4 * 4  # experts 0 (2 pairs), 1 (1), 3 (4) and 5 (1): a block each
    for b in range(used.item() // 4):
        pairs = [p for p in rows[b * 4 : (b + 1) * 4].tolist() if p < len(flat)]
        assert pairs and all(flat[p] == block_expert[b].item() for p in pairs)
    assert sorted(p for p in rows.tolist() if p < len(flat)) == list(range(len(flat)))


def test_block_with_shared_expert_matches_torch_on_every_path():
    block = _moe(shared=32)
    x = torch.randn(70, 64, device=DEVICE, dtype=DTYPE)
    from omni_core.models.kernels import fused_moe

    ids, weights, routed = _torch_reference(block, x)
    fused = fused_moe.experts_forward(x, block.experts.gate_up_proj, block.experts.down_proj, ids.int(), weights)
    torch.testing.assert_close(fused, routed, **TOL[DTYPE])
