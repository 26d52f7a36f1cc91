"""The staged decode MLP (``kernels.staged_mlp``: gate/up and down_proj with the weight staged in
shared memory) against the fused Triton kernels it replaces, alone and in an engine, and where it
must not be used. Needs a Hopper GPU (the kernels are built for it); their CUDA source compiling
and the shapes they take are checked without one (test_staged_mlp_compiles.py)."""

from types import SimpleNamespace

import pytest
import torch
from omni_core.models import Qwen2ForCausalLM, TritonPagedBackend, kernels, random_init
from omni_core.models.kernels import staged_mlp
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9, reason="needs a Hopper GPU"),
]

DEV = "cuda"


def weights(hidden, inter, seed):
    g = torch.Generator(device=DEV).manual_seed(seed)

    def randn(*shape, std=1.0, mean=0.0):
        return (torch.randn(*shape, generator=g, device=DEV) * std + mean).to(torch.bfloat16)

    return randn(1, hidden), randn(hidden, std=0.2, mean=1.0), randn(2 * inter, hidden, std=hidden**-0.5), randn(hidden, inter, std=inter**-0.5), randn


@pytest.mark.parametrize("hidden,inter", [(896, 4864), (256, 512), (384, 1000)])
@pytest.mark.parametrize("rows", [1, 2])
def test_matches_the_triton_kernels(rows, hidden, inter):
    _, norm, gate_up, down, randn = weights(hidden, inter, seed=rows + hidden)
    x, residual = randn(rows, hidden), randn(rows, hidden, std=4.0)
    out, total = staged_mlp.staged_mlp(x, residual, norm, 1e-6, gate_up, down)
    act, ref_total = kernels.skinny_gated_linear(x, gate_up, residual, norm, 1e-6)
    ref = kernels.skinny_linear(act, down)
    torch.cuda.synchronize()
    assert torch.equal(total, ref_total)  # the residual stream is rounded the same way
    assert out.shape == ref.shape and out.dtype == torch.bfloat16
    # the same roundings; sums in another order move a value by a bf16 step now and then
    torch.testing.assert_close(out.float(), ref.float(), atol=0.02, rtol=0.02)
    assert (out.float() - ref.float()).abs().mean() < 0.002
    again, _ = staged_mlp.staged_mlp(x, residual, norm, 1e-6, gate_up, down)
    assert torch.equal(again, out)  # fixed-order sums: the result does not depend on timing


def test_inside_a_cuda_graph_after_a_dependent_kernel():
    # o_proj (a Triton kernel that lets its successor launch early) then the staged MLP, replayed
    # with new inputs: the MLP must read o_proj's output of this replay, not stale data
    hidden, inter = 896, 4864
    _, norm, gate_up, down, randn = weights(hidden, inter, seed=5)
    o_weight = randn(hidden, hidden, std=hidden**-0.5)
    attn, residual = randn(1, hidden), randn(1, hidden)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        staged_mlp.staged_mlp(kernels.skinny_linear(attn, o_weight), residual, norm, 1e-6, gate_up, down)  # compile, load
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            out, total = staged_mlp.staged_mlp(kernels.skinny_linear(attn, o_weight), residual, norm, 1e-6, gate_up, down)
    for seed in range(3):
        attn.copy_(randn(1, hidden) * (seed + 1))
        residual.copy_(randn(1, hidden))
        graph.replay()
        ref, ref_total = staged_mlp.staged_mlp(kernels.skinny_linear(attn, o_weight), residual, norm, 1e-6, gate_up, down)
        torch.cuda.synchronize()
        assert torch.equal(out, ref) and torch.equal(total, ref_total)


def test_engine_tokens_match_the_triton_mlp():
    config = SimpleNamespace(
        vocab_size=256, hidden_size=256, intermediate_size=512, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        head_dim=64, max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0, tie_word_embeddings=False,
    )
    model = random_init(Qwen2ForCausalLM(config), seed=0, std=0.08).to(DEV, torch.bfloat16).eval()
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 150, 700)]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    engine_config = dict(block_size=16, num_kv_blocks=512, max_model_len=1024)
    runs = {}
    for staged in (False, True):
        for graphs in (False, True):
            engine = AREngine(model, EngineConfig(**engine_config, cuda_graphs=graphs, cuda_graph_sizes=(1, 2),
                                                  attention_backend=TritonPagedBackend(staged_mlp=staged)), device=DEV)
            # one and two sequences: decode steps of one and two rows
            runs[staged, graphs] = [o.token_ids for o in engine.generate(prompts[:1], params) + engine.generate(prompts[1:], params)]
            assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks
    assert staged_mlp.kernels_for(staged_mlp.MlpShape(256, 512, 1), torch.device(DEV, torch.cuda.current_device())) is not None
    assert runs[True, True] == runs[True, False]  # graphs replay what eager steps run
    # random weights: a greedy near-tie may flip on another summation order, so count tokens
    flips = sum(a != b for ref, out in zip(runs[False, False], runs[True, False], strict=True) for a, b in zip(ref, out, strict=True))
    assert flips == 0 or runs[False, False] != runs[True, False] and flips < 32, flips


def test_off_switch_and_shapes_it_does_not_take(monkeypatch):
    monkeypatch.delenv(kernels.STAGED_MLP_ENV, raising=False)
    assert TritonPagedBackend().staged_mlp is False  # opt-in
    monkeypatch.setenv(kernels.STAGED_MLP_ENV, "1")
    assert TritonPagedBackend().staged_mlp is True
    _, norm, gate_up, down, randn = weights(256, 512, seed=0)
    x = randn(3, 256)
    assert staged_mlp.staged_mlp(x, x, norm, 1e-6, gate_up, down) is None  # 3 rows
    assert staged_mlp.staged_mlp(x[:1].float(), x[:1].float(), norm, 1e-6, gate_up, down) is None  # not bf16
    big = staged_mlp.MlpShape(3584, 18944, 1)  # a 7B MLP: its slices do not fit in shared memory
    assert "shared memory" in staged_mlp.unsupported_reason(big, torch.device(DEV, torch.cuda.current_device()))
