"""The lock-step decoders' attention (models/lockstep.py) against attention written out row by row."""

import torch
from omni_core.models.layers import RotaryEmbedding, apply_rotary
from omni_core.models.lockstep import Passes, attend


def test_a_pass_past_earlier_positions_attends_causally_from_its_own_start():
    # two positions, then two more: the second pass's rows see the first pass's keys and, causally, their own
    torch.manual_seed(0)
    batch, heads, kv_heads, dim, positions = 2, 4, 2, 16, 6
    passes = Passes(RotaryEmbedding(dim, positions, 10000.0), positions)
    cache = (torch.zeros(batch * positions, kv_heads, dim), torch.zeros(batch * positions, kv_heads, dim))
    qs, ks, vs, outs = [], [], [], []
    for start, new in ((0, 2), (2, 2)):
        step = passes.get(batch, start, new, cache[0])
        q, k, v = torch.randn(batch * new, heads, dim), torch.randn(batch * new, kv_heads, dim), torch.randn(batch * new, kv_heads, dim)
        rq, rk = apply_rotary(q, k, step.rope)
        qs.append(rq.view(batch, new, heads, dim))
        ks.append(rk.view(batch, new, kv_heads, dim))
        vs.append(v.view(batch, new, kv_heads, dim))
        outs.append(attend(q.clone(), k.clone(), v, step, cache, fused=False).view(batch, new, heads, dim))
    q, k, v = torch.cat(qs, 1), torch.cat(ks, 1), torch.cat(vs, 1)
    group = heads // kv_heads
    for b in range(batch):
        for p in range(4):
            for h in range(heads):
                scores = (k[b, : p + 1, h // group] @ q[b, p, h]) / dim**0.5
                expected = scores.softmax(0) @ v[b, : p + 1, h // group]
                torch.testing.assert_close(outs[p // 2][b, p % 2, h], expected, rtol=1e-5, atol=1e-5)
