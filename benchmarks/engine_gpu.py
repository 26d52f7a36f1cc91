"""Decode step time of the AR engine on one GPU against the memory-bandwidth roofline, eager and
with CUDA graphs, and tokens/s against transformers' generate on the same GPU.

Model: Qwen2-0.5B-shaped (24 layers, hidden 896, 14/2 heads of 64, FFN 4864) with CosyVoice3's
speech head size (vocab 6761, tied), random bf16 weights, made by transformers and loaded
through our checkpoint loader. Roofline of one decode step = (weight bytes + KV bytes of the
batch's context) / measured device-to-device copy bandwidth (bytes read + written per second).

    python benchmarks/engine_gpu.py [--batches 1 8 32 64] [--context 512]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import torch
import transformers
from omni_core.scheduler import AREngine, EngineRequest, SamplingParams


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(20):
        dst.copy_(src)
    end.record()
    torch.cuda.synchronize()
    return 2 * nbytes * 20 / (start.elapsed_time(end) / 1e3)


def make_checkpoint(path: str, vocab: int) -> transformers.PreTrainedModel:
    config = transformers.Qwen2Config(
        vocab_size=vocab, hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, max_position_embeddings=32768, tie_word_embeddings=True, rope_theta=1e6, dtype="bfloat16",
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(path)
    return model


def decode_step_ms(engine: AREngine, batch: int, context: int, steps: int, vocab: int) -> tuple[float, float | None]:
    """(engine.step() ms, model-only graph replay ms or None) at ``batch`` running sequences."""
    gen = torch.Generator().manual_seed(batch)
    for i in range(batch):
        prompt = torch.randint(0, vocab, (context,), generator=gen).tolist()
        engine.add_request(EngineRequest(f"b{batch}-{i}", prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=steps + 20, ignore_eos=True)))
    while engine.scheduler.waiting or engine.scheduler.prefilling:
        engine.step()
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        engine.step()
    torch.cuda.synchronize()
    step_ms = (time.perf_counter() - start) / steps * 1e3
    replay_ms = None
    width = max(len(s.block_table) for s in engine.scheduler.running)
    key = engine.runner._graph_key(batch, width)
    if key is not None:
        graph = engine.runner.graphs[key][0]
        graph.replay()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(50):
            graph.replay()
        e.record()
        torch.cuda.synchronize()
        replay_ms = s.elapsed_time(e) / 50
    for rid in list(engine.requests):
        engine.abort(rid)
    return step_ms, replay_ms


def tokens_per_second(engine: AREngine, hf, batch: int, context: int, new_tokens: int, vocab: int) -> tuple[float, float]:
    gen = torch.Generator().manual_seed(1000 + batch)
    prompts = [torch.randint(0, vocab, (context,), generator=gen).tolist() for _ in range(batch)]
    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    torch.cuda.synchronize()
    ours = batch * new_tokens / (time.perf_counter() - t)
    assert all(len(o.token_ids) == new_tokens for o in outs)
    ids = torch.tensor(prompts, device="cuda")
    with torch.inference_mode():
        hf.generate(ids[:, :16], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm-up
        torch.cuda.synchronize()
        t = time.perf_counter()
        hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
        torch.cuda.synchronize()
    theirs = batch * new_tokens / (time.perf_counter() - t)
    return ours, theirs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=6761)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--throughput-batches", type=int, nargs="+", default=[1, 8, 32])
    args = parser.parse_args()
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, transformers {transformers.__version__}")
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s (read + write)")
    with tempfile.TemporaryDirectory() as tmp:
        hf = make_checkpoint(tmp, args.vocab)
        engines = {}
        for mode in ("eager", "graphs"):
            t = time.perf_counter()
            engines[mode] = AREngine.from_pretrained(
                tmp, device="cuda", dtype=torch.bfloat16, max_num_seqs=max(args.batches + args.throughput_batches),
                max_model_len=2048, kv_cache_bytes=8 << 30, cuda_graphs=(mode == "graphs"), cuda_graph_kv_lens=(1024,),
            )
            print(f"{mode} engine ready in {time.perf_counter() - t:.1f} s ({len(engines[mode].runner.graphs)} graphs)")
        model = engines["eager"].model
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        spec = model.kv_cache_spec
        kv_per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2
        print(f"weights {weight_bytes / 1e6:.0f} MB; KV {kv_per_token} B/token")
        print()
        print("| batch | roofline ms | eager step ms | graph step ms | graph replay ms (model only) | graph step % of roofline |")
        print("| --- | --- | --- | --- | --- | --- |")
        for b in args.batches:
            roof = (weight_bytes + b * (args.context + 30) * kv_per_token) / bandwidth * 1e3
            eager, _ = decode_step_ms(engines["eager"], b, args.context, args.steps, args.vocab)
            graph, replay = decode_step_ms(engines["graphs"], b, args.context, args.steps, args.vocab)
            replay_s = f"{replay:.3f}" if replay is not None else "-"
            print(f"| {b} | {roof:.3f} | {eager:.3f} | {graph:.3f} | {replay_s} | {100 * roof / graph:.0f}% |", flush=True)
        print()
        print("| batch | prompt | new tokens | ours (graphs) tok/s | transformers generate tok/s | ratio |")
        print("| --- | --- | --- | --- | --- | --- |")
        for b in args.throughput_batches:
            ours, theirs = tokens_per_second(engines["graphs"], hf, b, args.context, args.new_tokens, args.vocab)
            print(f"| {b} | {args.context} | {args.new_tokens} | {ours:.0f} | {theirs:.0f} | {ours / theirs:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
