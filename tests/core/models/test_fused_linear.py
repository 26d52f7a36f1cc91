"""The fused decode-row kernels (``kernels.fused_linear``) against the torch ops they replace,
and an engine whose decode steps run them against one that does not.

Like test_triton_kernels.py, they run on CPU tensors in float32 under ``TRITON_INTERPRET=1`` (the
suite does that in a subprocess, see test_backend_selection.py) and on CUDA in bfloat16.
"""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from omni_core.models import Qwen2ForCausalLM, TritonPagedBackend, kernels, random_init
from omni_core.models.attention import store_kv
from omni_core.models.layers import RMSNorm, RotaryEmbedding, apply_rotary
from omni_core.models.logits_head import LogitsHead, skinny_head
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

from tests.helpers.triton_target import DEVICE, DTYPE, INTERPRET, TOL, requires_triton_target

pytestmark = requires_triton_target
ROWS = [1, 2, 5]


def randn(*shape):
    return torch.randn(*shape, device=DEVICE, dtype=DTYPE)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def norm_of(size):
    norm = RMSNorm(size, eps=1e-6).to(DEVICE, DTYPE).requires_grad_(False)
    norm.weight.normal_(1, 0.2)
    return norm


def float_norm(norm, x, residual=None):
    """What the fused kernels compute for RMSNorm: the residual sum as ``norm(x, residual)`` stores
    it (returned too), the norm itself in float32, its output not rounded."""
    total = x if residual is None else norm(x, residual)[1]
    return F.rms_norm(total.float(), (total.shape[-1],), norm.weight.float(), norm.eps), total


def project(normed, weight, bias=None):
    """``normed @ weight^T + bias`` in float32."""
    return F.linear(normed, weight.float(), None if bias is None else bias.float())


@pytest.mark.parametrize("rows", ROWS)
def test_linear_plain_and_after_norm(rows):
    # K and N not multiples of the tiles: masked edges
    K, N = 96, 40
    x, residual, weight, bias = randn(rows, K), randn(rows, K), randn(N, K), randn(N)
    torch.testing.assert_close(kernels.skinny_linear(x, weight), F.linear(x, weight), **TOL[DTYPE])
    torch.testing.assert_close(kernels.skinny_linear(x, weight, bias), F.linear(x, weight, bias), **TOL[DTYPE])
    norm = norm_of(K)
    out = kernels.skinny_linear(x, weight, norm_weight=norm.weight, eps=norm.eps)
    torch.testing.assert_close(out.float(), project(float_norm(norm, x)[0], weight), **TOL[DTYPE])
    out, total = kernels.skinny_linear(x, weight, residual=residual, norm_weight=norm.weight, eps=norm.eps)
    ref_normed, ref_total = float_norm(norm, x, residual)
    torch.testing.assert_close(total, ref_total, rtol=0, atol=0)  # the residual stream is stored as the unfused add stores it
    torch.testing.assert_close(out.float(), project(ref_normed, weight), **TOL[DTYPE])


@pytest.mark.parametrize("rows", ROWS)
def test_logits_head_takes_the_skinny_kernel_for_decode_rows_on_cuda(rows):
    hidden, weight = randn(rows, 96), randn(301, 96)
    assert skinny_head(hidden, weight) == (DEVICE == "cuda" and rows <= kernels.SKINNY_MAX_ROWS)
    head = LogitsHead()
    for _ in range(2):  # the CPU path packs the weight on the first call and reuses it
        torch.testing.assert_close(head(hidden, weight), F.linear(hidden, weight), **TOL[DTYPE])


@pytest.mark.parametrize("rows", ROWS)
def test_gated_linear(rows):
    K, inter = 64, 72
    x, residual, gate_up = randn(rows, K), randn(rows, K), randn(2 * inter, K) * 0.2
    norm = norm_of(K)
    act, total = kernels.skinny_gated_linear(x, gate_up, residual, norm.weight, norm.eps)
    ref_normed, ref_total = float_norm(norm, x, residual)
    # the unfused path rounds the matmul's output before the activation: so does the kernel
    gate, up = project(ref_normed, gate_up).to(DTYPE).float().chunk(2, dim=-1)
    torch.testing.assert_close(total, ref_total, rtol=0, atol=0)
    torch.testing.assert_close(act.float(), F.silu(gate) * up, **TOL[DTYPE])
    torch.testing.assert_close(kernels.skinny_gated_linear(x, gate_up), kernels.silu_mul(F.linear(x, gate_up)), **TOL[DTYPE])


# by_position: the kernel is given the whole cos/sin tables and looks each row's position up;
# one row takes a narrower tile in one warp (fused_linear._qkv_tile)
_QKV_FLAGS = [(True, False, 5), (False, False, 5), (False, True, 5), (False, True, 1)]
# under the (slow) interpreter every flag at head dim 16 and one case at 32; on a GPU every case
_QKV_CASES = (
    [(4, 2, 16, *f) for f in _QKV_FLAGS] + [(4, 2, 32, False, True, 5)]
    if INTERPRET
    else [(*h, *f) for h in [(4, 2, 16), (14, 2, 64), (16, 8, 128)] for f in _QKV_FLAGS]
)


@pytest.mark.parametrize("heads,kv_heads,dim,first_layer,by_position,T", _QKV_CASES)
def test_qkv_rotary_store(heads, kv_heads, dim, first_layer, by_position, T):
    hidden = 48
    positions = torch.tensor([0, 3, 17, 100, 255][:T], device=DEVICE)
    rotary = RotaryEmbedding(dim, 256, 10000.0).to(DEVICE)
    cos, sin = rotary.table(positions, DTYPE)
    given = dict(cos=rotary.cos, sin=rotary.sin, positions=positions) if by_position else dict(cos=cos, sin=sin)
    weight, bias = randn((heads + 2 * kv_heads) * dim, hidden) * 0.2, randn((heads + 2 * kv_heads) * dim)
    x, residual = randn(T, hidden), randn(T, hidden)
    norm = norm_of(hidden)
    slots = torch.tensor([3, 40, 41, 0, 63][:T], device=DEVICE)
    k_cache, v_cache = torch.zeros(2, 64, kv_heads, dim, device=DEVICE, dtype=DTYPE)
    if first_layer:
        q = kernels.qkv_rotary_store(x, weight, bias, slot_mapping=slots, k_cache=k_cache, v_cache=v_cache, num_heads=heads, num_kv_heads=kv_heads,
                                     head_dim=dim, norm_weight=norm.weight, eps=norm.eps, **given)
        normed, _ = float_norm(norm, x)
    else:
        q, total = kernels.qkv_rotary_store(x, weight, bias, slot_mapping=slots, k_cache=k_cache, v_cache=v_cache, num_heads=heads,
                                            num_kv_heads=kv_heads, head_dim=dim, residual=residual, norm_weight=norm.weight, eps=norm.eps, **given)
        normed, ref_total = float_norm(norm, x, residual)
        torch.testing.assert_close(total, ref_total, rtol=0, atol=0)
    # rounded before the rotary, as the unfused projection's output is
    ref_q, ref_k, ref_v = project(normed, weight, bias).to(DTYPE).split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
    ref_q, ref_k = apply_rotary(ref_q.view(T, heads, dim), ref_k.view(T, kv_heads, dim), (cos, sin))
    ref_k_cache, ref_v_cache = torch.zeros(2, 64, kv_heads, dim, device=DEVICE, dtype=DTYPE)
    store_kv(ref_k, ref_v.view(T, kv_heads, dim), ref_k_cache, ref_v_cache, slots)
    torch.testing.assert_close(q.view(T, heads, dim), ref_q, **TOL[DTYPE])
    torch.testing.assert_close(k_cache, ref_k_cache, **TOL[DTYPE])
    torch.testing.assert_close(v_cache, ref_v_cache, **TOL[DTYPE])


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("K", [80, 88])
def test_weight_streamed_over_several_k_tiles(rows, K):
    # tiles narrower than K: the first (and the tail past the whole tiles: 16 of 80, 24 of 88 in a
    # masked 32-wide tile) is requested before the prologue and each next one while the current is
    # multiplied; with 16-wide tiles, 80 is five whole tiles and 88 leaves a tail of 8
    from omni_core.models.kernels import fused_linear

    N, inter = 24, 20
    x, residual, weight, bias = randn(rows, K), randn(rows, K), randn(N, K), randn(N)
    norm = norm_of(K)
    out, total = fused_linear.linear(x, weight, bias, residual, norm.weight, norm.eps, block_k=32)
    ref_normed, ref_total = float_norm(norm, x, residual)
    torch.testing.assert_close(total, ref_total, rtol=0, atol=0)
    torch.testing.assert_close(out.float(), project(ref_normed, weight, bias), **TOL[DTYPE])
    gate_up = randn(2 * inter, K) * 0.2
    gate, up = project(float_norm(norm, x)[0], gate_up).to(DTYPE).float().chunk(2, dim=-1)
    act = fused_linear.gated_linear(x, gate_up, None, norm.weight, norm.eps, block_k=16)
    torch.testing.assert_close(act.float(), F.silu(gate) * up, **TOL[DTYPE])


def test_head_dim_the_fused_projection_cannot_tile_is_refused():
    assert not kernels.fuses_qkv_rotary(12) and kernels.fuses_qkv_rotary(16) and kernels.fuses_qkv_rotary(64)
    with pytest.raises(ValueError, match="multiple of 8"):
        caches = torch.zeros(2, 8, 1, 12, device=DEVICE, dtype=DTYPE)
        kernels.qkv_rotary_store(randn(1, 8), randn(36, 8), None, randn(1, 12), randn(1, 12), torch.zeros(1, dtype=torch.long, device=DEVICE), caches[0], caches[1], 1, 1, 12)


def test_engine_decode_with_fused_rows_matches_without():
    config = SimpleNamespace(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    model = random_init(Qwen2ForCausalLM(config), seed=0, std=0.08).to(DEVICE, DTYPE).eval()
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in ((3, 21) if INTERPRET else (3, 70))]
    params = SamplingParams(temperature=0, max_tokens=3 if INTERPRET else 24, ignore_eos=True)
    engine_config = dict(block_size=16, num_kv_blocks=64, cuda_graph_sizes=(1, 2, 4, 8))
    ref = AREngine(model, EngineConfig(**engine_config, attention_backend=TritonPagedBackend(num_splits=2, fused_rows=False)), device=DEVICE).generate(prompts, params)
    engine = AREngine(model, EngineConfig(**engine_config, attention_backend=TritonPagedBackend(num_splits=2)), device=DEVICE)
    out = engine.generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in ref]
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
