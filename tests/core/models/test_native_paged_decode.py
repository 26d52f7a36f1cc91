"""The host C kernel for paged decode attention: against per-sequence SDPA, when the backend takes
it, built once per machine, and the torch fallback where it cannot be built."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from omni_core.models import SdpaBackend, native
from omni_core.models.attention import AttentionMetadata
from omni_core.models.native import paged_decode

from tests.helpers.paged import reference_attention, scattered_cache

pytestmark = pytest.mark.skipif(not paged_decode.available(), reason="no C compiler on this machine")


def _paged_step(context_lens, heads, kv_heads, dim, block_size, seed=0):
    """Caches with each sequence's blocks scattered in a shuffled order, and one query per sequence."""
    g = torch.Generator().manual_seed(seed)
    tables, k_cache, v_cache = scattered_cache(context_lens, kv_heads, dim, block_size, g, spare_blocks=5)
    return torch.randn(len(context_lens), heads, dim, generator=g), k_cache, v_cache, tables


def _reference(q, k_cache, v_cache, tables, context_lens, block_size):
    return reference_attention(q, k_cache, v_cache, tables, context_lens, [1] * len(context_lens), block_size)


@pytest.mark.parametrize(
    ("context_lens", "heads", "kv_heads", "dim", "block_size"),
    [
        ([1], 2, 2, 32, 16),  # one cached token
        ([16, 8, 33, 200, 7], 8, 2, 32, 16),  # whole blocks, runs of eight keys and tails, grouped queries
        ([5, 64, 130], 14, 2, 64, 16),  # seven query heads a KV head (Qwen2-0.5B's grouping)
        ([40, 9, 257], 4, 1, 128, 32),  # one KV head
        ([23, 3, 70], 6, 3, 40, 4),  # a head size without a fixed-size copy, small blocks
        ([31, 12], 4, 2, 20, 8),  # and one not a multiple of eight
    ],
)
def test_kernel_equals_sdpa_over_the_paged_cache(context_lens, heads, kv_heads, dim, block_size):
    q, k_cache, v_cache, tables = _paged_step(context_lens, heads, kv_heads, dim, block_size)
    got = paged_decode.paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(context_lens), max(context_lens), block_size, dim**-0.5)
    torch.testing.assert_close(got, _reference(q, k_cache, v_cache, tables, context_lens, block_size), rtol=1e-5, atol=1e-5)


def test_large_scores_do_not_overflow():
    """The softmax subtracts each head's largest score: logits of several hundred stay finite."""
    context_lens = [50, 9]
    q, k_cache, v_cache, tables = _paged_step(context_lens, 4, 2, 32, 16)
    q = q * 40
    got = paged_decode.paged_decode_attention(q, k_cache, v_cache, tables, torch.tensor(context_lens), max(context_lens), 16, 1.0)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, _reference(q * 32**0.5, k_cache, v_cache, tables, context_lens, 16), rtol=1e-4, atol=1e-4)


def test_backend_takes_the_kernel_with_few_intra_op_threads():
    """More threads than ``MAX_INTRA_OP_THREADS``: SDPA's parallel loops on the grouped path."""
    context_lens = [9, 30]
    _, _, _, tables = _paged_step(context_lens, 4, 2, 8, 4)
    threads = torch.get_num_threads()
    chosen = {}
    try:
        for n in (1, native.MAX_INTRA_OP_THREADS, native.MAX_INTRA_OP_THREADS + 1):
            torch.set_num_threads(n)
            ctx = torch.tensor(context_lens)
            meta = AttentionMetadata(ctx, tables, ctx, torch.ones_like(ctx), 1, 4)
            meta.host_query_lens, meta.host_context_lens = [1, 1], context_lens
            SdpaBackend().prepare(meta)
            chosen[n] = "native_decode" in meta.cache
    finally:
        torch.set_num_threads(threads)
    assert list(chosen.values()) == [True, True, False]


def test_backend_decodes_float32_on_the_kernel_and_other_caches_grouped():
    context_lens = [9, 30, 2]
    q, k_cache, v_cache, tables = _paged_step(context_lens, 4, 2, 8, 4)
    ctx = torch.tensor(context_lens)
    last = ctx - 1
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    for dtype, path in ((torch.float32, "native"), (torch.bfloat16, "grouped")):
        meta = AttentionMetadata(tables[torch.arange(3), last // 4] * 4 + last % 4, tables, ctx, torch.ones_like(ctx), 1, 4)
        meta.host_query_lens, meta.host_context_lens = [1] * 3, context_lens
        backend = SdpaBackend()
        backend.prepare(meta)
        kc, vc = k_cache.to(dtype), v_cache.to(dtype)
        out = backend.forward(q.to(dtype), k.to(dtype), v.to(dtype), kc, vc, meta, 8**-0.5)
        assert ("decode_plan" in meta.cache) == (path == "grouped")
        torch.testing.assert_close(out.float(), _reference(q.to(dtype).float(), kc.float(), vc.float(), tables, context_lens, 4), rtol=2e-2 if dtype != torch.float32 else 1e-5, atol=2e-2 if dtype != torch.float32 else 1e-5)


def _python(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a new interpreter (from the repository root, so ``tests.helpers`` imports)."""
    return subprocess.run([sys.executable, "-c", code, *args], env={**os.environ, **env}, capture_output=True, text=True, timeout=300, cwd=os.getcwd())


def test_library_is_built_once_per_cache_dir(tmp_path):
    code = "from omni_core.models.native import paged_decode; print(paged_decode.available())"
    first = _python(code, OMNI_CACHE=str(tmp_path))
    assert first.stdout.strip() == "True", first.stderr
    (library,) = (tmp_path / "native").glob("paged_decode-*.so")
    built_at = library.stat().st_mtime_ns
    again = _python(code, OMNI_CACHE=str(tmp_path))
    assert again.stdout.strip() == "True"
    assert [p.name for p in (tmp_path / "native").iterdir()] == [library.name]  # reused, no leftovers
    assert library.stat().st_mtime_ns == built_at


@pytest.mark.parametrize("env", [{"OMNI_NATIVE": "0"}, {"CC": "false"}], ids=["switched off", "compiler fails"])
def test_engine_falls_back_to_torch_when_the_kernels_are_unavailable(tmp_path, env):
    """Without the host kernels a CPU engine runs torch ops (decode attention on the grouped SDPA
    path), with the same tokens."""
    code = """
import torch
from omni_core.models.native import paged_decode
from tests.helpers.hf_models import save_hf_models
from omni_core.scheduler import AREngine, SamplingParams
import pathlib, sys
torch.set_num_threads(1)  # the kernel's setting (paged_decode.preferred)
torch.manual_seed(0)
_, path = save_hf_models(pathlib.Path(sys.argv[1]), {"m": {"arch": "Qwen2ForCausalLM", "vocab_size": 128}})["m"]
engine = AREngine.from_pretrained(path, device="cpu")
prompts = [[1, 2, 3], list(range(5, 40)), [7] * 20]
outs = engine.generate(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
print(paged_decode.available(), [o.token_ids for o in outs])
"""
    def run(**extra):
        return _python(code, str(tmp_path / "ckpt"), OMNI_CACHE=str(tmp_path / "cache"), **extra)

    without = run(**env)
    assert without.returncode == 0, without.stderr
    assert without.stdout.startswith("False "), without.stdout
    if env.get("CC") == "false":
        assert "fall back to torch" in without.stderr  # said once, not silently slower
    with_kernel = run()
    assert with_kernel.stdout.startswith("True ")
    assert without.stdout.split(" ", 1)[1] == with_kernel.stdout.split(" ", 1)[1]


def test_a_cpu_engine_builds_the_kernels_when_it_is_made(tmp_path):
    """Not in its first request's step: the compiler runs while the engine is made."""
    code = """
import pathlib, sys
from omni_core.scheduler import AREngine
from tests.helpers.hf_models import save_hf_models
_, path = save_hf_models(pathlib.Path(sys.argv[1]), {"m": {"arch": "Qwen2ForCausalLM", "vocab_size": 64}})["m"]
AREngine.from_pretrained(path, device="cpu")
"""
    made = _python(code, str(tmp_path / "ckpt"), OMNI_CACHE=str(tmp_path / "cache"))
    assert made.returncode == 0, made.stderr
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "cache" / "native").glob("*.so")) == sorted(native.KERNELS)
