"""Fused Triton kernels and TritonPagedBackend against the torch path they replace.

They run where Triton can: on CPU tensors in float32 under ``TRITON_INTERPRET=1`` (the suite does
that in a subprocess, see test_backend_selection.py) and on CUDA in bfloat16; elsewhere they skip.
"""

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from omni_core.models import Qwen2ForCausalLM, Qwen3ForCausalLM, TritonPagedBackend, kernels, random_init
from omni_core.models.attention import store_kv
from omni_core.models.layers import GatedMLP, RMSNorm, RotaryEmbedding, apply_rotary
from omni_core.scheduler import AREngine, ARHooks, EngineConfig, SamplingParams

from tests.helpers.triton_target import DEVICE, DTYPE, INTERPRET, TOL, requires_triton_target

pytestmark = requires_triton_target


def randn(*shape, dtype=None):
    return torch.randn(*shape, device=DEVICE, dtype=dtype or DTYPE)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("hidden", [96] if INTERPRET else [96, 896])
def test_rms_norm_with_and_without_residual(hidden):
    norm = RMSNorm(hidden, eps=1e-6).to(DEVICE, DTYPE)
    with torch.no_grad():
        norm.weight.normal_(1, 0.2)
    x, residual = randn(7, hidden), randn(7, hidden)
    torch.testing.assert_close(norm(x, fused=True), norm(x), **TOL[DTYPE])
    normed, total = norm(x, residual, fused=True)
    ref_normed, ref_total = norm(x, residual)
    torch.testing.assert_close(total, ref_total, **TOL[DTYPE])
    torch.testing.assert_close(normed, ref_normed, **TOL[DTYPE])
    assert total.data_ptr() not in (x.data_ptr(), residual.data_ptr())  # inputs are left as they were


def test_silu_mul_matches_gated_mlp():
    mlp = GatedMLP(64, 80).to(DEVICE, DTYPE)
    x = randn(5, 64)
    torch.testing.assert_close(mlp(x, fused=True), mlp(x), **TOL[DTYPE])
    gate_up = randn(3, 2, 160)
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(kernels.silu_mul(gate_up), F.silu(gate) * up, **TOL[DTYPE])


@pytest.mark.parametrize("vocab", [1, 200, 6761])
def test_argmax_takes_the_first_largest_logit(vocab, monkeypatch):
    from omni_core.models.kernels import greedy

    monkeypatch.setattr(greedy, "CHUNK", 64)  # several chunks per row, so ties can span them
    logits = randn(3, vocab)
    if vocab > 130:
        logits[0, [7, 130]] = 10.0  # a tie across chunks and one inside a chunk: the first wins
        logits[1, [70, 71]] = 10.0
    got = kernels.argmax(logits)
    assert got.dtype == torch.int64
    assert torch.equal(got, logits.argmax(dim=-1))
    assert kernels.argmax(logits[:0]).shape == (0,)
    copy = torch.full((3,), -1, dtype=torch.int64, device=DEVICE)
    assert torch.equal(kernels.argmax(logits, copy_to=copy), got) and torch.equal(copy, got)  # the same tokens stored twice


# under the interpreter only small shapes: each program runs as Python
SHAPES = [(4, 2, 16)] if INTERPRET else [(4, 2, 16), (14, 2, 64)]


@pytest.mark.parametrize("heads,kv_heads,dim", SHAPES)
def test_rotary_and_cache_write(heads, kv_heads, dim):
    T = 5
    rotary = RotaryEmbedding(dim, 256, 10000.0).to(DEVICE)
    cos, sin = rotary.table(torch.tensor([0, 3, 17, 100, 255], device=DEVICE), DTYPE)
    qkv = randn(T, (heads + 2 * kv_heads) * dim)  # q, k, v as views of one packed projection
    q, k, v = qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    q, k, v = q.view(T, heads, dim), k.view(T, kv_heads, dim), v.view(T, kv_heads, dim)
    ref_q, ref_k = apply_rotary(q, k, (cos, sin))
    ref_k_cache, ref_v_cache = torch.zeros(2, 64, kv_heads, dim, device=DEVICE, dtype=DTYPE)
    slots = torch.tensor([3, 40, 41, 0, 63], device=DEVICE)
    store_kv(ref_k, v, ref_k_cache, ref_v_cache, slots)
    k_cache, v_cache = torch.zeros(2, 64, kv_heads, dim, device=DEVICE, dtype=DTYPE)
    kernels.rotary_store_kv(q, k, v, cos, sin, k_cache, v_cache, slots)
    torch.testing.assert_close(q, ref_q, **TOL[DTYPE])
    torch.testing.assert_close(k, ref_k, **TOL[DTYPE])
    torch.testing.assert_close(k_cache, ref_k_cache, **TOL[DTYPE])
    torch.testing.assert_close(v_cache, ref_v_cache, rtol=0, atol=0)
    untouched = torch.ones(64, dtype=torch.bool, device=DEVICE)
    untouched[slots] = False
    assert not k_cache[untouched].any() and not v_cache[untouched].any()


def reference_decode(q, k_cache, v_cache, block_tables, context_lens, block_size, scale):
    """Per sequence: gather its slots, float32 SDPA with grouped KV heads."""
    outs = []
    for b in range(q.shape[0]):
        pos = torch.arange(int(context_lens[b]), device=q.device)
        slots = block_tables[b, pos // block_size] * block_size + pos % block_size
        keys, values = (c[slots].transpose(0, 1)[None].float() for c in (k_cache, v_cache))
        out = F.scaled_dot_product_attention(q[b][None, :, None].float(), keys, values, scale=scale, enable_gqa=True)
        outs.append(out[0, :, 0])
    return torch.stack(outs)


@pytest.mark.parametrize("num_splits", [1, 3] if INTERPRET else [1, 3, None])
@pytest.mark.parametrize("heads,kv_heads,dim", [(8, 2, 32)] if INTERPRET else [(8, 2, 32), (14, 2, 64)])
def test_paged_decode_attention(num_splits, heads, kv_heads, dim):
    from omni_core.models.kernels.paged_attention import paged_decode_attention

    block_size, num_blocks, width = 16, 48, 10
    k_cache, v_cache = randn(2, num_blocks * block_size, kv_heads, dim)
    # lengths: a single token, a partial block, a full table, and one ending on a block boundary
    context_lens = torch.tensor([1, 37, width * block_size, 64], device=DEVICE)
    B = len(context_lens)
    block_tables = torch.stack([torch.randperm(num_blocks, device=DEVICE)[:width] for _ in range(B)])
    q = randn(B, heads + 3, dim)[:, 1 : heads + 1]  # a strided view, as split from a packed qkv
    scale = dim**-0.5
    out = paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, block_size, scale, num_splits, block_n=16)
    ref = reference_decode(q, k_cache, v_cache, block_tables, context_lens, block_size, scale)
    assert out.dtype == DTYPE and out.shape == (B, heads, dim)
    torch.testing.assert_close(out.float(), ref, **TOL[DTYPE])


class LogitRecorder(ARHooks):
    """Keeps every sampled row's logits per request, in step order."""

    def __init__(self):
        self.logits = defaultdict(list)

    def post_prefill(self, batch, hidden, logits, token_ids):
        self._keep(batch, logits)

    def post_decode(self, batch, hidden, logits, token_ids):
        self._keep(batch, logits)

    def _keep(self, batch, logits):
        for row, b in enumerate(batch.sample_index):
            self.logits[batch.request_ids[b]].append(logits[row].float().cpu())


def assert_same_greedy_run(ref, ref_hooks, out, hooks, atol):
    """Logits agree step by step; tokens agree until a step whose reference top-2 margin is within
    the tolerance (a near-tie either kernel may round the other way), after which runs may part."""
    for a, b in zip(ref, out, strict=True):
        ref_logits, logits = ref_hooks.logits[a.request_id], hooks.logits[b.request_id]
        assert len(logits) == len(b.token_ids) and len(ref_logits) == len(a.token_ids)
        for step, (ra, rb) in enumerate(zip(ref_logits, logits, strict=True)):
            assert (ra - rb).abs().max().item() <= atol, f"step {step}"
            if a.token_ids[step] != b.token_ids[step]:
                top2 = ra.topk(2).values
                assert (top2[0] - top2[1]).item() <= 2 * atol, f"tokens differ at step {step} without a near-tie"
                break


def tiny_model(arch: str):
    """2 layers, 4 query / 2 KV heads; weights larger than the preset's give peaked logits. The
    config carries just the fields the backbones read (no transformers import: the interpreter
    run starts in a fresh process and this keeps it short)."""
    config = SimpleNamespace(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    model_class = {"Qwen2": Qwen2ForCausalLM, "Qwen3": Qwen3ForCausalLM}[arch]
    return random_init(model_class(config), seed=0, std=0.08).to(DEVICE, DTYPE).eval()


@pytest.mark.parametrize("arch", ["Qwen2", "Qwen3"])
def test_triton_backend_generates_like_sdpa(arch):
    model = tiny_model(arch)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in ((3, 21, 1) if INTERPRET else (3, 17, 40, 1, 70))]
    params = SamplingParams(temperature=0, max_tokens=4 if INTERPRET else 24, ignore_eos=True)
    # a 16-token prefill budget splits the longer prompts: their later chunks read cached history
    config = dict(block_size=16, num_kv_blocks=64, max_num_batched_tokens=16, cuda_graph_sizes=(1, 2, 4, 8))
    ref_hooks, hooks = LogitRecorder(), LogitRecorder()
    ref = AREngine(model, EngineConfig(**config, attention_backend="sdpa"), hooks=ref_hooks, device=DEVICE).generate(prompts, params)
    engine = AREngine(model, EngineConfig(**config, attention_backend=TritonPagedBackend(num_splits=None if DEVICE == "cuda" else 2)), hooks=hooks, device=DEVICE)
    if DEVICE == "cuda":
        assert engine.runner.graphs  # decode replays graphs that hold the Triton kernels
    out = engine.generate(prompts, params)
    if DTYPE == torch.float32:
        assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    atol = 1e-4 if DTYPE == torch.float32 else 0.05 * max(1.0, max(r.abs().max().item() for v in ref_hooks.logits.values() for r in v))
    assert_same_greedy_run(ref, ref_hooks, out, hooks, atol)
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks  # nothing leaked
