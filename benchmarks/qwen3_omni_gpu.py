"""Qwen3-Omni's thinker language model on one GPU at its real sizes, random bf16 weights built in
memory (no checkpoint written): prefill and decode tokens/s of our engine at several batch sizes,
the decode step against the memory roofline of the weights a step reads, and transformers'
``generate`` on the same GPU and shapes.

Model: Qwen3-Omni-30B-A3B's thinker text model (48 layers, hidden 2048, 32 query / 4 KV heads of
128, 128 experts top-8 of width 768 in every layer, vocab 152064, M-RoPE) with normal(0, 0.02)
weights: 30.5B parameters, 61 GB. Each batch: B prompts of ``--prompt`` random tokens (prefix cache
off), prefilled (timed: prefill tokens/s), then ``--steps`` decode steps timed after 3 warm-up
steps (decode tokens/s, ms a step). Roofline of a step = bytes it must read (every attention, norm
and router weight, the logits head, the experts the batch's tokens are routed to, the batch's KV)
/ measured copy bandwidth; the expected number of distinct experts a layer reads for B tokens is
taken for uniform routing, E * (1 - (1 - k/E)^B), which random weights give. transformers (eager,
its default experts loop, dynamic cache) generates ``--hf-new`` tokens for each of ``--hf-batches``
after the same prompts; its tokens/s is new tokens over the whole generate call, and its decode step
is (time of hf-new tokens - time of 1) / (hf-new - 1).

    python benchmarks/qwen3_omni_gpu.py --batches 1 8 32 64 --hf-batches 1 8 32 64
    python benchmarks/qwen3_omni_gpu.py --small --device cpu      # a dry run of the script
"""

from __future__ import annotations

import argparse
import gc
import json
import time

import torch
import transformers
from engine_gpu import (
    copy_bandwidth,  # benchmarks/: the same measured bandwidth as the dense engine's roofline
)
from omni_core.models.construct import constructing
from omni_core.scheduler import AREngine, EngineConfig, EngineRequest, SamplingParams
from omni_qwen3_omni.checkpoint import random_fill
from omni_qwen3_omni.presets import FULL_SIZES, FULL_VOCAB_SIZE

REAL = dict(FULL_SIZES["thinker"]["text_config"], vocab_size=FULL_VOCAB_SIZE)  # Qwen3-Omni-30B-A3B's thinker LM
SMALL = dict(REAL, vocab_size=1024, hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=64,
             rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 6, 6], "interleaved": True})


def sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def device_bandwidth(device) -> float | None:
    return copy_bandwidth() if torch.device(device).type == "cuda" else None


def step_bytes(cfg: dict, batch: int, context: int) -> float:
    h, layers, e, k = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_experts"], cfg["num_experts_per_tok"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    attention = h * (q + 2 * kv) + q * h + 2 * cfg["head_dim"] + 2 * h
    router = e * h
    expert = 3 * h * cfg["moe_intermediate_size"]
    touched = e * (1 - (1 - k / e) ** batch)
    kv_bytes = batch * context * layers * 2 * kv * 2
    return 2 * (layers * (attention + router + touched * expert) + cfg["vocab_size"] * h + batch * h) + kv_bytes


def ours(cfg: dict, args, device: str, dtype: torch.dtype) -> list[dict]:
    from omni_qwen3_omni.thinker import ThinkerLM

    config = transformers.Qwen3OmniMoeTextConfig(**cfg)
    with constructing(device, dtype):
        model = ThinkerLM(config).eval()
    random_fill(model)
    context = args.prompt + args.steps + 16
    engine = AREngine(model, EngineConfig(
        max_num_seqs=max(args.batches), kv_cache_bytes=int(args.kv_gib * (1 << 30)), max_model_len=context,
        enable_prefix_caching=False, cuda_graph_sizes=tuple(args.batches), cuda_graph_kv_lens=(context,),
        max_num_batched_tokens=args.prefill_tokens, cuda_graphs=not args.eager,
    ), device=device)
    bandwidth = device_bandwidth(device)
    gen = torch.Generator().manual_seed(1)
    rows = []
    # the first round compiles the kernels each shape needs (Triton JIT); the second is reported
    for batch in [b for b in args.batches for _ in range(2)]:
        ids = [f"b{batch}-{i}" for i in range(batch)]
        for rid in ids:
            prompt = torch.randint(0, cfg["vocab_size"], (args.prompt,), generator=gen).tolist()
            engine.add_request(EngineRequest(rid, prompt_token_ids=prompt, params=SamplingParams(temperature=0, max_tokens=args.steps + 8, ignore_eos=True)))
        sync(device)
        start = time.perf_counter()
        while engine.scheduler.waiting or engine.scheduler.prefilling:
            engine.step()
        sync(device)
        prefill_s = time.perf_counter() - start
        for _ in range(3):
            engine.step()
        sync(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            engine.step()
        sync(device)
        decode_s = time.perf_counter() - start
        for rid in ids:
            engine.abort(rid)
        while engine.in_flight is not None:
            engine.step()
        step_ms = decode_s / args.steps * 1e3
        roof_ms = step_bytes(cfg, batch, args.prompt + args.steps // 2) / bandwidth * 1e3 if bandwidth else None
        if rows and rows[-1]["batch"] == batch and rows[-1].get("warm-up"):
            rows.pop()
        else:
            rows.append({"batch": batch, "warm-up": True})
            continue
        rows.append(dict(system="omni", batch=batch, prefill_tok_s=batch * args.prompt / prefill_s, decode_tok_s=batch * args.steps / decode_s,
                         step_ms=step_ms, roofline_ms=roof_ms, roofline_fraction=roof_ms / step_ms if roof_ms else None))
        print(json.dumps(rows[-1]), flush=True)
    del engine, model
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    return rows


def reference(cfg: dict, args, device: str, dtype: torch.dtype) -> list[dict]:
    thinker = transformers.Qwen3OmniMoeThinkerConfig(
        text_config=cfg,
        audio_config=dict(encoder_layers=1, d_model=64, encoder_attention_heads=2, encoder_ffn_dim=64, output_dim=cfg["hidden_size"], downsample_hidden_size=8),
        vision_config=dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=cfg["hidden_size"], deepstack_visual_indexes=[0]),
        vision_start_token_id=151652,
    )
    with constructing(device, dtype):
        model = transformers.Qwen3OmniMoeThinkerForConditionalGeneration(thinker).eval()
    random_fill(model)
    gen = torch.Generator().manual_seed(1)
    rows = []
    warm = torch.zeros(1, 8, dtype=torch.long, device=device)
    model.generate(input_ids=warm, attention_mask=torch.ones_like(warm), max_new_tokens=2, do_sample=False, pad_token_id=0)
    for batch in args.hf_batches:
        ids = torch.randint(0, cfg["vocab_size"], (batch, args.prompt), generator=gen).to(device)
        times = {}
        for new in (1, args.hf_new):
            sync(device)
            start = time.perf_counter()
            model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
            sync(device)
            times[new] = time.perf_counter() - start
        step_ms = (times[args.hf_new] - times[1]) / (args.hf_new - 1) * 1e3
        rows.append(dict(system="transformers", batch=batch, prefill_tok_s=batch * args.prompt / times[1], decode_tok_s=batch * 1e3 / step_ms,
                         step_ms=step_ms, generate_tok_s=batch * args.hf_new / times[args.hf_new]))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--hf-batches", type=int, nargs="*", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--hf-new", type=int, default=16)
    parser.add_argument("--prefill-tokens", type=int, default=8192)
    parser.add_argument("--kv-gib", type=float, default=8.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs")
    parser.add_argument("--small", action="store_true", help="a tiny config: a dry run of the script")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    cfg = SMALL if args.small else REAL
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    rows = ours(cfg, args, args.device, dtype)
    if args.hf_batches:
        rows += reference(cfg, args, args.device, dtype)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
