"""The cluster attention kernel (``kernels.cluster_attention``: norm, q/k/v, rotary, cache write
and paged attention of one decode row in one kernel) against the fused Triton kernels it
replaces, alone, in a CUDA graph after a kernel that launches it early, and in an engine; and
where it must not be used. Needs a Hopper GPU (the kernel is built for it); its source compiling
and the shapes it takes are checked without one (test_cluster_attention_compiles.py)."""

import pytest
import torch
from omni_core.models import TritonPagedBackend, kernels
from omni_core.models.kernels import cluster_attention
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

from tests.core.models.test_decode_step_kernel import decode_context, make_model

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU"),
]

DEV = "cuda"
SHAPES = {  # (hidden, heads, KV heads): the GPU tests' tiny model, Qwen2-0.5B's attention, one KV head
    "tiny": dict(hidden_size=256, num_attention_heads=4, num_key_value_heads=2),
    "qwen2-0.5b": dict(hidden_size=896, num_attention_heads=14, num_key_value_heads=2),
    "one-kv-head": dict(hidden_size=384, num_attention_heads=6, num_key_value_heads=1),
}


def both_paths(model, context, block_size, with_residual, seed):
    """Layer 1's attention half through the cluster kernel and through the Triton kernels, each on
    its own copy of the same paged cache: ((out, residual, cache), (out, residual, cache))."""
    layer = model.model.layers[1]
    attn, norm, rotary = layer.self_attn, layer.input_layernorm, model.model.rotary
    hidden = model.config.hidden_size
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn(1, hidden, generator=g, device=DEV).to(torch.bfloat16)
    residual = (torch.randn(1, hidden, generator=g, device=DEV) * 4).to(torch.bfloat16) if with_residual else None
    results = []
    for cluster in (True, False):
        ctx, cache, positions = decode_context(model, context, block_size, seed=seed)
        meta = ctx.meta
        k_cache, v_cache = ctx.kv_caches[1]
        args = (attn.num_heads, attn.num_kv_heads, attn.head_dim)
        if cluster:
            result = kernels.cluster_decode_attention(
                x, residual, norm.weight, norm.eps, attn.qkv_proj.weight, attn.qkv_proj.bias, rotary.cos, rotary.sin, positions,
                meta.slot_mapping, k_cache, v_cache, meta.block_tables, meta.context_lens, *args, block_size,
            )
            assert result is not None, "the kernel does not apply"
            out, total = result
        else:
            q = kernels.qkv_rotary_store(x, attn.qkv_proj.weight, attn.qkv_proj.bias, rotary.cos, rotary.sin, meta.slot_mapping, k_cache, v_cache,
                                         *args, residual=residual, norm_weight=norm.weight, eps=norm.eps, positions=positions)
            q, total = q if residual is not None else (q, x)
            out = kernels.paged_decode_attention(q.view(1, attn.num_heads, attn.head_dim), k_cache, v_cache, meta.block_tables, meta.context_lens,
                                                 block_size, attn.head_dim**-0.5).reshape(1, -1)
        results.append((out, total, cache))
    torch.cuda.synchronize()
    return results


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("context,block_size", [(1, 16), (37, 16), (300, 16), (1000, 64), (3000, 16)])
def test_matches_the_triton_kernels(shape, context, block_size):
    model = make_model(**SHAPES[shape])
    for with_residual in (True, False):
        (out, total, cache), (ref, ref_total, ref_cache) = both_paths(model, context, block_size, with_residual, seed=context)
        assert torch.equal(total, ref_total)  # the residual stream is rounded the same way
        assert out.shape == ref.shape and out.dtype == torch.bfloat16
        # the same roundings; sums in another order move a value by a bf16 step now and then
        torch.testing.assert_close(out.float(), ref.float(), atol=0.03, rtol=0.03)
        assert (out.float() - ref.float()).abs().mean() < 0.005
        diff = (cache != ref_cache).nonzero()
        assert diff.numel() == 0 or set(diff[:, 1].tolist()) == {1}  # layer 1's cache only
        torch.testing.assert_close(cache.float(), ref_cache.float(), atol=0.03, rtol=0.03)  # its new K/V
        (again, _, _), _ = both_paths(model, context, block_size, with_residual, seed=context)
        assert torch.equal(again, out)  # fixed-order sums: the result does not depend on timing


def test_inside_a_cuda_graph_after_a_dependent_kernel():
    # a Triton projection that lets its successor launch early, then the cluster kernel, replayed
    # with new inputs: the kernel must read this replay's x, not stale data
    model = make_model(**SHAPES["qwen2-0.5b"])
    layer = model.model.layers[0]
    attn, norm, rotary = layer.self_attn, layer.input_layernorm, model.model.rotary
    ctx, cache, positions = decode_context(model, 300, 16, seed=1)
    meta = ctx.meta
    g = torch.Generator(device=DEV).manual_seed(0)
    down = (torch.randn(896, 896, generator=g, device=DEV) * 896**-0.5).to(torch.bfloat16)
    act, residual = torch.zeros(1, 896, dtype=torch.bfloat16, device=DEV), torch.zeros(1, 896, dtype=torch.bfloat16, device=DEV)

    def run():
        return kernels.cluster_decode_attention(
            kernels.skinny_linear(act, down), residual, norm.weight, norm.eps, attn.qkv_proj.weight, attn.qkv_proj.bias, rotary.cos, rotary.sin,
            positions, meta.slot_mapping, *ctx.kv_caches[0], meta.block_tables, meta.context_lens, attn.num_heads, attn.num_kv_heads, 64, 16,
        )

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()  # compile, load
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, total = run()
    for seed in range(3):
        act.copy_(torch.randn(1, 896, generator=g, device=DEV) * (seed + 1))
        residual.copy_(torch.randn(1, 896, generator=g, device=DEV))
        graph.replay()
        ref, ref_total = run()
        torch.cuda.synchronize()
        assert torch.equal(out, ref) and torch.equal(total, ref_total)


def test_engine_tokens_match_the_triton_kernels():
    model = make_model()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 150, 700)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    config = dict(block_size=16, num_kv_blocks=256, max_model_len=1024)
    runs = {}
    for graphs in (False, True):
        engine = AREngine(model, EngineConfig(**config, cuda_graphs=graphs, cuda_graph_sizes=(1, 2),
                                              attention_backend=TritonPagedBackend(cluster_attention=True)), device=DEV)
        # one sequence at a time (one-row decode steps: the kernel), then two together (the Triton kernels)
        runs[graphs] = [engine.generate([p], params)[0].token_ids for p in prompts] + [o.token_ids for o in engine.generate(prompts[:2], params)]
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    built = cluster_attention.kernel_for(cluster_attention.AttentionShape(256, 4, 2, 64, 16, True, True), torch.device(DEV, torch.cuda.current_device()))
    assert built is not None and built.launches > 0  # the engine's one-row steps ran it
    assert runs[True] == runs[False]  # graphs replay what eager steps run
    # each token is the Triton path's greedy choice after the same prefix (teacher-forced, so a
    # near-tie flipped once does not carry over into the rest of the sequence)
    ref = AREngine(model, EngineConfig(**{**config, "num_kv_blocks": 2048}, attention_backend=TritonPagedBackend(cluster_attention=False)), device=DEV)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    mismatches = 0
    for prompt, out in zip(prompts, runs[True][:3], strict=True):
        chosen = ref.generate([prompt + out[:k] for k in range(len(out))], one)
        mismatches += sum(c.token_ids[0] != t for c, t in zip(chosen, out, strict=True))
    assert mismatches <= 4, mismatches  # 3 of 96 on the H200: this tiny random model has many near-ties


def test_switch_and_what_it_does_not_take(monkeypatch):
    monkeypatch.delenv(kernels.CLUSTER_ATTENTION_ENV, raising=False)
    assert TritonPagedBackend().cluster_attention is False
    monkeypatch.setenv(kernels.CLUSTER_ATTENTION_ENV, "1")
    assert TritonPagedBackend().cluster_attention is True
    model = make_model()
    attn, norm, rotary = model.model.layers[0].self_attn, model.model.layers[0].input_layernorm, model.model.rotary
    ctx, _, positions = decode_context(model, 10, 16, seed=0)
    meta = ctx.meta

    def call(x, weight=attn.qkv_proj.weight, head_dim=64):
        return kernels.cluster_decode_attention(x, x, norm.weight, norm.eps, weight, attn.qkv_proj.bias, rotary.cos, rotary.sin, positions,
                                                meta.slot_mapping, *ctx.kv_caches[0], meta.block_tables, meta.context_lens, 4, 2, head_dim, 16)

    x = torch.randn(2, 256, device=DEV).to(torch.bfloat16)
    assert call(x[:1]) is not None
    assert call(x) is None  # two rows
    assert call(x[:1].float()) is None  # not bf16
    assert call(x[:1], attn.qkv_proj.weight.float()) is None
    device = torch.device(DEV, torch.cuda.current_device())
    assert cluster_attention.kernel_for(cluster_attention.AttentionShape(256, 4, 2, 128, 16, True, True), device) is None  # head size 128
