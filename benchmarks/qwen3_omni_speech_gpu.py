"""Qwen3-Omni's speech half on one GPU at its real sizes, random bf16 weights built in memory: the
talker stage (the talker on the core engine with the code predictor in its steps) and the code2wav
stage, driven by hand as the runtime drives them, with every request's reply text already there
(the thinker's share is measured by qwen3_omni_gpu.py). transformers' talker ``generate`` (with
its code predictor) on the same GPU for comparison.

Model: Qwen3-Omni-30B-A3B's talker (20 layers, hidden 1024, 16 query / 2 KV heads of 128, 128
experts top-6 of width 384 plus a shared expert of 768, codec vocabulary 3072), code predictor
(5 dense layers of 1024, 16 codebooks) and code2wav (8 layers, decoder width 1536, 1920 samples a
frame at 24 kHz). Each run: B requests with a ``--prompt``-token user turn and ``--reply`` reply
tokens, all submitted at once; the talker samples (temperature 0.9, top-k 50) until each has
``--frames`` frames; code2wav decodes the first 4 frames, then every 25. Reported: time to the
first audio chunk (p50 / max over requests), the talker's step time, audio seconds made per wall
second, and the real-time factor of a stream (wall time / its audio). code2wav runs on the
runtime's batch executor (its own thread and CUDA stream), as in a server.

    python benchmarks/qwen3_omni_speech_gpu.py --batches 1 8 32 --hf-batches 1
    python benchmarks/qwen3_omni_speech_gpu.py --small --device cpu --batches 1 2 --hf-batches 1   # a dry run
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import threading
import time

import torch
from omni_core.pipeline import StageSpec
from omni_core.scheduler import AREngine, EngineConfig
from omni_core.scheduler.batching import BatchExecutor
from omni_core.scheduler.executor import Message, StageContext
from omni_qwen3_omni.checkpoint import random_fill
from omni_qwen3_omni.presets import FULL_SIZES

# the full preset's sizes (Qwen3-Omni-30B-A3B) with the thinker's ids the talker reads
TALKER = dict(FULL_SIZES["talker"], thinker_hidden_size=2048, audio_token_id=151675, image_token_id=151655, video_token_id=151656,
              vision_start_token_id=151652, audio_start_token_id=151669)
CODE2WAV = FULL_SIZES["code2wav"]
THINKER_VOCAB, THINKER_HIDDEN = 152064, 2048
REQUEST_NUMBERS = itertools.count()


def small(cfg: dict) -> dict:
    text = dict(cfg["text_config"], hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                shared_expert_intermediate_size=64,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3], "interleaved": True})
    pred = dict(cfg["code_predictor_config"], hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16)
    return dict(cfg, text_config=text, code_predictor_config=pred, thinker_hidden_size=64)


def sync(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def build(args, device: str, dtype: torch.dtype):
    from omni_core.models.construct import constructing
    from omni_qwen3_omni.code2wav import Code2Wav
    from omni_qwen3_omni.code2wav_stage import Chunking, Code2WavWorker
    from omni_qwen3_omni.code_predictor import CodePredictor
    from omni_qwen3_omni.speech import SpeechIds
    from omni_qwen3_omni.talker import TalkerLM, TalkerProjections
    from omni_qwen3_omni.talker_stage import TalkerSampling, TalkerWorker
    from transformers.models.qwen3_omni_moe.configuration_qwen3_omni_moe import (
        Qwen3OmniMoeCode2WavConfig,
        Qwen3OmniMoeTalkerConfig,
    )

    cfg = small(TALKER) if args.small else TALKER
    talker_config = Qwen3OmniMoeTalkerConfig(**cfg)
    c2w = dict(CODE2WAV, hidden_size=64, decoder_dim=64, num_hidden_layers=1, intermediate_size=128) if args.small else CODE2WAV
    code2wav_config = Qwen3OmniMoeCode2WavConfig(**c2w)
    with constructing(device, dtype):
        model, projections = TalkerLM(talker_config.text_config), TalkerProjections(talker_config)
        predictor = CodePredictor(talker_config.code_predictor_config)
        table = torch.nn.Embedding(1024 if args.small else THINKER_VOCAB, talker_config.thinker_hidden_size)
        vocoder = Code2Wav(code2wav_config)
    for i, part in enumerate((model, projections, predictor, table, vocoder)):
        random_fill(part, f"{i}.")
    speech = SpeechIds(im_start=1, user=2, assistant=3, tts_bos=4, tts_eos=5, tts_pad=6, codec_nothink=2155, codec_think_bos=2156,
                       codec_think_eos=2157, codec_pad=2148, codec_bos=2149, codec_eos=2150, speakers=dict(cfg["speaker_id"]),
                       accept_hidden_layer=24, num_code_groups=16, codec_vocab=3072)
    engine_config = EngineConfig(max_num_seqs=max(args.batches), kv_cache_bytes=int(args.kv_gib * (1 << 30)), cuda_graphs=not args.eager,
                                 enable_prefix_caching=False)
    worker = TalkerWorker(model.eval(), projections.eval(), predictor.eval(), table.eval(), speech, engine_config,
                          TalkerSampling(max_tokens=args.frames + 1))
    engine = AREngine(model, engine_config, hooks=worker.hooks, device=device)
    worker.engine, worker.max_model_len = engine, engine.max_model_len
    return worker, engine, Code2WavWorker(vocoder.eval(), Chunking()), talker_config


def vocoder_stage(code2wav, device: str, on_audio) -> BatchExecutor:
    """code2wav on the runtime's own batch executor (its thread, batching window and queue)."""
    stage = StageSpec("code2wav", "batch", lambda context: code2wav, options={"max_batch": 64, "batch_window_ms": 2})
    context = StageContext(stage="code2wav", device=device, emit=on_audio, fail=lambda rid, error: print("failed", rid, error))
    executor = BatchExecutor(stage, context)
    executor.start()
    return executor


def ours(worker, engine, code2wav, batch: int, args, vocab: int) -> dict:
    """The talker driven as its engine loop drives it; its frames go to code2wav's executor."""
    rng = torch.Generator().manual_seed(batch)
    worker.sampling.max_tokens = args.frames + 1  # the last frame is not voiced
    first_audio: dict[str, float] = {}
    ended = threading.Semaphore(0)

    def on_audio(message: Message) -> None:
        if message.payload["audio"].numel() and message.request_id not in first_audio:
            first_audio[message.request_id] = time.perf_counter() - start
        if message.end:
            ended.release()

    vocoder = None if args.no_vocoder else vocoder_stage(code2wav, args.device, on_audio)
    start = time.perf_counter()
    frames = 0
    for i in range(batch):
        user = torch.randint(10, vocab, (args.prompt,), generator=rng).tolist()
        reply = torch.randint(10, vocab, (args.reply,), generator=rng).tolist()
        plan = {"user_ids": user, "media_rows": [], "media_positions": [], "assistant_ids": [1, 3, 7], "speaker": 2302, "rope_positions": None}
        # ids never reused: code2wav ignores messages for a request it has released
        engine.add_request(worker.make_request(Message(f"r{next(REQUEST_NUMBERS)}", "in", {"plan": plan, "spoken": [1, 3, 7] + reply, "seed": i}, end=True)))
    sent: dict[str, int] = {}

    def emit_codes(rid):
        def emit(port, payload, end=False):
            if vocoder is None:
                first_audio.setdefault(rid, time.perf_counter() - start)  # the talker alone: its first frame
                return
            vocoder.submit(Message(rid, "in", payload, end=end, seq=sent.get(rid, 0)))
            sent[rid] = sent.get(rid, 0) + 1
        return emit

    steps = 0
    step_start = None
    while engine.has_unfinished():
        outputs = engine.step()
        steps += 1
        if steps == 3:
            sync(args.device)
            step_start = time.perf_counter()
        for o in outputs:
            frames += len(o.new_token_ids) - int(o.finished)  # the last frame is not voiced
            if worker.on_output(o.request_id, o.new_token_ids, o.finished, o.step_outputs, emit_codes(o.request_id)):
                engine.abort(o.request_id)
    sync(args.device)
    step_ms = (time.perf_counter() - step_start) / max(1, steps - 3) * 1e3 if step_start else float("nan")
    if vocoder is not None:
        for _ in range(batch):
            ended.acquire(timeout=60)
        vocoder.stop()
    wall = time.perf_counter() - start
    audio_s = frames * 0.08
    ttfa = sorted(first_audio.values())
    return {
        "batch": batch, "frames": frames, "wall_s": round(wall, 3), "audio_s_per_s": round(audio_s / wall, 1),
        "rtf": round(wall / (audio_s / batch), 3), "step_ms": round(step_ms, 2),
        "first_audio_ms_p50": round(statistics.median(ttfa) * 1e3, 1), "first_audio_ms_max": round(ttfa[-1] * 1e3, 1),
    }


def vocoder_chunks(code2wav, args, batches: list[int]) -> list[dict]:
    """code2wav alone: ms to decode a first chunk (4 frames, no context) and a steady chunk (25
    frames after 25 of context) for B requests at once."""
    rows = []
    model = code2wav.model
    for batch in batches:
        row = {"batch": batch}
        for name, frames, context in (("first_chunk_ms", 4, 0), ("chunk_ms", 25, 25)):
            codes = torch.randint(0, 2048, (batch, 16, frames + context), device=model.code_embedding.weight.device)
            for _ in range(2):
                model.decode_chunk(codes, context)
            sync(args.device)
            t = time.perf_counter()
            for _ in range(5):
                model.decode_chunk(codes, context)
            sync(args.device)
            row[name] = round((time.perf_counter() - t) / 5 * 1e3, 2)
        rows.append(row)
    return rows


def reference(talker_config, batch: int, args, device: str, dtype: torch.dtype) -> dict:
    """transformers' talker generate (code predictor included) for ``--hf-frames`` frames."""
    from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
        Qwen3OmniMoeTalkerForConditionalGeneration,
    )

    with torch.device(device):
        model = Qwen3OmniMoeTalkerForConditionalGeneration._from_config(talker_config, dtype=dtype).eval()
    random_fill(model, "7.")
    hidden = talker_config.text_config.hidden_size
    length = args.prompt + 9
    embeds = torch.randn(batch, length, hidden, device=device, dtype=dtype) * 0.02
    trailing = torch.randn(batch, args.reply, hidden, device=device, dtype=dtype) * 0.02
    pad = torch.randn(batch, 1, hidden, device=device, dtype=dtype) * 0.02
    kwargs = dict(inputs_embeds=embeds, trailing_text_hidden=trailing, tts_pad_embed=pad, talker_input_ids=torch.zeros(batch, length, dtype=torch.long, device=device),
                  attention_mask=torch.ones(batch, length, dtype=torch.long, device=device), do_sample=True, top_k=50, temperature=0.9,
                  eos_token_id=2150, output_hidden_states=True, return_dict_in_generate=True)
    times = {}
    for new in (1, args.hf_frames):
        sync(device)
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(max_new_tokens=new, min_new_tokens=new, **kwargs)
        sync(device)
        times[new] = time.perf_counter() - t
    step = (times[args.hf_frames] - times[1]) / (args.hf_frames - 1)
    del model
    torch.cuda.empty_cache() if torch.device(device).type == "cuda" else None
    return {"batch": batch, "step_ms": round(step * 1e3, 2), "audio_s_per_s": round(batch * 0.08 / step, 2), "rtf": round(step / 0.08, 3),
            "first_frame_ms": round(times[1] * 1e3, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--hf-batches", type=int, nargs="*", default=[1])
    parser.add_argument("--prompt", type=int, default=200)
    parser.add_argument("--reply", type=int, default=60)
    parser.add_argument("--frames", type=int, default=125, help="frames a request speaks (80 ms each)")
    parser.add_argument("--hf-frames", type=int, default=16)
    parser.add_argument("--kv-gib", type=float, default=4.0)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--eager", action="store_true")
    parser.add_argument("--no-vocoder", action="store_true", help="the talker alone (first audio: its first frame)")
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each batch (the first may meet new shapes)")
    parser.add_argument("--json")
    args = parser.parse_args()
    dtype = torch.bfloat16 if torch.device(args.device).type == "cuda" else torch.float32
    worker, engine, code2wav, talker_config = build(args, args.device, dtype)
    vocab = 1024 if args.small else THINKER_VOCAB
    ours(worker, engine, code2wav, 1, argparse.Namespace(**{**vars(args), "frames": 30}), vocab)  # warm up
    rows = {"ours": [ours(worker, engine, code2wav, b, args, vocab) for b in args.batches for _ in range(args.repeat)]}
    for row in rows["ours"]:
        print(json.dumps({"ours": row}), flush=True)
    args.no_vocoder = True
    rows["talker_alone"] = [ours(worker, engine, code2wav, b, args, vocab) for b in args.batches]
    for row in rows["talker_alone"]:
        print(json.dumps({"talker_alone": row}), flush=True)
    rows["code2wav"] = vocoder_chunks(code2wav, args, args.batches)
    for row in rows["code2wav"]:
        print(json.dumps({"code2wav": row}), flush=True)
    del worker, engine, code2wav
    rows["transformers"] = [reference(talker_config, b, args, args.device, dtype) for b in args.hf_batches]
    for row in rows["transformers"]:
        print(json.dumps({"transformers": row}), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
