"""The build options fish-s2pro reads (``omni serve --option KEY=VALUE``): its FamilySpec declares
them, so a key not named here is refused, and ``omni families fish-s2pro`` prints this table."""

from omni_core.hooks import PREFILL_GRAPHS_HELP

OPTIONS = {
    "dtype": "auto (the platform's: bfloat16 on CUDA and XPU, float32 on CPU) | float32 | bfloat16 | float16",
    "codec_dtype": "the codec's dtype (float32)",
    "max_batch": "sequences the dual AR steps together, and requests a codec call takes (32)",
    "batch_window_ms": "how long the codec waits to fill a batch (1)",
    "kv_cache_bytes": "the slow AR's KV-cache budget (half the free GPU memory, 1 GiB on CPU)",
    "max_num_batched_tokens": "tokens of a prefill step; longer prompts are prefilled in chunks (8192)",
    "max_model_len": "prompt + reply tokens (the model's max_seq_len)",
    "cuda_graphs": "on CUDA, the slow AR's decode steps and each step's fast AR in CUDA graphs (true)",
    "prefill_graphs": PREFILL_GRAPHS_HELP,
    "max_new_tokens": "frames a reply may speak, ~46 ms each (1024)",
    "segment_context": "earlier segments of a long text a segment's prompt carries (one voice); 0: none (2)",
    "temperature": "the default sampling temperature of both ARs; 0: greedy (0.8)",
    "top_p": "the default top-p (0.8)",
    "top_k": "the default top-k (30)",
    "audio_first_chunk": "frames before the first audio (4)",
    "audio_chunk": "the most frames a later audio chunk waits for (32)",
    "audio_left_context": "frames of latents the codec decodes again before each chunk (8)",
}
