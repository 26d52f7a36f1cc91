"""The one-kernel batch-1 decode forward (``kernels.decode_step``) against the per-layer fused
kernels it replaces: the same hidden state and cache writes for one step over scattered paged
caches of several lengths, the same greedy tokens in an engine (eager and CUDA graphs), and the
cases where it must not be used. Needs a Hopper GPU (the kernel is built for it)."""

from types import SimpleNamespace

import pytest
import torch
from omni_core.models import Qwen2ForCausalLM, Qwen3ForCausalLM, TritonPagedBackend, kernels, random_init
from omni_core.models.attention import AttentionMetadata, ForwardContext
from omni_core.models.kernels import decode_step
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU"),
]

DEV = "cuda"


@pytest.fixture(autouse=True)
def _kernel_on(monkeypatch):
    monkeypatch.setenv(decode_step.DECODE_STEP_ENV, "1")  # opt-in (kernels.decode_step_enabled)


def qwen2_config(**overrides):
    base = dict(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    return SimpleNamespace(**{**base, **overrides})


def make_model(cls=Qwen2ForCausalLM, **overrides):
    model = random_init(cls(qwen2_config(**overrides)), seed=0, std=0.08).to(DEV, torch.bfloat16).eval()
    g = torch.Generator().manual_seed(1)  # the same model in every test and run
    for name, p in model.named_parameters():  # norms away from one, so their weights are read
        if name.endswith("norm.weight"):
            p.data.copy_(torch.randn(p.shape, generator=g) * 0.2 + 1.0)
    return model


def decode_context(model, context: int, block_size: int, seed: int):
    """A ForwardContext for one decode token at position ``context - 1`` over a paged cache with
    random history in scattered blocks (the fused path's kind)."""
    g = torch.Generator().manual_seed(seed)
    spec = model.kv_cache_spec
    blocks = -(-context // block_size)
    num_blocks = blocks * 3 + 1
    cache = torch.randn(2, spec.num_layers, num_blocks * block_size, spec.num_kv_heads, spec.head_dim, generator=g).to(DEV, torch.bfloat16)
    table = torch.randperm(num_blocks, generator=g)[:blocks]
    position = context - 1
    slot = int(table[position // block_size]) * block_size + position % block_size
    width = blocks + 2  # wider than needed: entries past the context are never read
    row = torch.cat([table, torch.zeros(width - blocks, dtype=torch.int64)])[None]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([slot], device=DEV), block_tables=row.to(DEV), context_lens=torch.tensor([context], device=DEV),
        query_lens=torch.ones(1, dtype=torch.int64, device=DEV), max_query_len=1, block_size=block_size,
    )
    caches = [(cache[0, i], cache[1, i]) for i in range(spec.num_layers)]
    return ForwardContext(meta, TritonPagedBackend(), caches, False), cache, torch.tensor([position], device=DEV)


@pytest.mark.parametrize("context,block_size", [(1, 16), (37, 16), (300, 16), (1000, 64), (3000, 16)])
def test_one_step_matches_the_per_layer_kernels(context, block_size):
    model = make_model()
    embeds = torch.randn(1, 256, generator=torch.Generator().manual_seed(context)).to(DEV, torch.bfloat16)
    ctx, cache, positions = decode_context(model, context, block_size, seed=context)
    ref_ctx, ref_cache, _ = decode_context(model, context, block_size, seed=context)
    assert torch.equal(cache, ref_cache)
    step = kernels.decode_step_kernel(model, ctx.kv_caches, block_size, torch.device(DEV))
    assert step is not None
    out = step(embeds, positions, ctx.meta)
    ref = model.model(embeds, positions, ref_ctx)
    torch.cuda.synchronize()
    assert out.shape == ref.shape == (1, 256) and out.dtype == ref.dtype
    # both round to bf16 at the same points; sums in another order move a value by a few bf16 steps
    # (the per-layer kernels' tiles set their order: with this seeded model, means of 0.0073-0.0100
    # over the five cases on the H200, so 0.01 would sit on the edge)
    torch.testing.assert_close(out.float(), ref.float(), atol=0.06, rtol=0.03)
    assert (out.float() - ref.float()).abs().mean() < 0.02
    slot = int(ctx.meta.slot_mapping)
    written = cache[:, :, slot].float()
    torch.testing.assert_close(written, ref_cache[:, :, slot].float(), atol=0.06, rtol=0.03)
    cache[:, :, slot] = ref_cache[:, :, slot]
    assert torch.equal(cache, ref_cache)  # nothing but the new token's slot was written
    again = step(embeds, positions, ctx.meta)  # the barrier and scratch are left ready for the next step
    assert torch.equal(again, out)  # and the result does not depend on timing


def test_engine_tokens_match_the_per_layer_kernels(monkeypatch):
    model = make_model()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 150, 700)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    config = dict(block_size=16, num_kv_blocks=256, max_model_len=1024)
    runs = {}
    for graphs in (False, True):
        engine = AREngine(model, EngineConfig(**config, cuda_graphs=graphs, cuda_graph_sizes=(1, 2)), device=DEV)
        runs[graphs] = [engine.generate([p], params)[0].token_ids for p in prompts]  # one sequence: batch-1 decode steps
        assert isinstance(model._decode_step[1], decode_step.DecodeStepKernel)
        assert bool(engine.runner.graphs) == graphs
        assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert runs[True] == runs[False]  # the kernel's sums have a fixed order: replays give the same tokens
    # each token is the per-layer path's greedy choice after the same prefix (teacher-forced, so a
    # near-tie flipped once does not carry over into the rest of the sequence)
    monkeypatch.setenv(decode_step.DECODE_STEP_ENV, "0")
    ref = AREngine(model, EngineConfig(**{**config, "num_kv_blocks": 2048}, cuda_graphs=False), device=DEV)
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    mismatches = 0
    for prompt, out in zip(prompts, runs[True], strict=True):
        chosen = ref.generate([prompt + out[:k] for k in range(len(out))], one)
        mismatches += sum(c.token_ids[0] != t for c, t in zip(chosen, out, strict=True))
    assert mismatches <= 2, mismatches


def test_where_it_does_not_apply(monkeypatch):
    device = torch.device(DEV)
    model = make_model()
    ctx, _, _ = decode_context(model, 10, 16, seed=0)
    reason = decode_step.DecodeStepKernel.unsupported_reason
    assert reason(model, ctx.kv_caches, 16, device) is None
    monkeypatch.delenv(decode_step.DECODE_STEP_ENV)
    assert "OMNI_DECODE_STEP_KERNEL" in reason(model, ctx.kv_caches, 16, device)  # off by default
    monkeypatch.setenv(decode_step.DECODE_STEP_ENV, "1")
    assert "head size" in reason(make_model(head_dim=32, num_attention_heads=8), ctx.kv_caches, 16, device)
    assert "q/k norms" in reason(make_model(Qwen3ForCausalLM), ctx.kv_caches, 16, device)
    assert "bf16" in reason(make_model().float(), ctx.kv_caches, 16, device)
    assert "multiples" in reason(make_model(intermediate_size=384), ctx.kv_caches, 16, device)
