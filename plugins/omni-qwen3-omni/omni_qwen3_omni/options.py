"""The build options qwen3-omni reads (``omni serve --option KEY=VALUE``): its FamilySpec declares
them, so a key not named here is refused, and ``omni families qwen3-omni`` prints this table."""

from omni_core.hooks import PREFILL_GRAPHS_HELP, ar_stream_help

OPTIONS = {
    "dtype": "auto (the platform's: bfloat16 on CUDA and XPU, float32 on CPU) | float32 | bfloat16 | float16",
    "max_batch": "thinker and talker sequences, and requests an encoder call takes (32)",
    "batch_window_ms": "how long an encoder or code2wav waits to fill a batch (2)",
    "max_model_len": "prompt + reply tokens (32768, or the model's limit)",
    "kv_cache_bytes": "the thinker's KV-cache budget (half the free GPU memory, 1 GiB on CPU)",
    "max_num_batched_tokens": "tokens of a prefill step; longer prompts are prefilled in chunks (8192)",
    "cuda_graphs": "decode steps and short prefills in CUDA graphs on CUDA (true)",
    "prefill_graphs": PREFILL_GRAPHS_HELP,
    "prefix_caching": "reuse the KV of shared prompt prefixes (true)",
    "max_audios": "audio parts a request may hold (8)",
    "max_images": "image parts a request may hold (8)",
    "max_videos": "video parts a request may hold (2)",
    "video_fps": "video frames sampled a second (2)",
    "video_max_frames": "video frames at most (64)",
    "video_min_pixels": "pixels a video frame is scaled to at least (131072)",
    "video_max_pixels": "pixels a video frame is scaled to at most (786432)",
    "audio_output": "build the talker and code2wav (true where the checkpoint has a talker)",
    "talker_temperature": "the talker's sampling temperature; 0: greedy talker and code predictor (0.9)",
    "talker_top_k": "the talker's top-k (50)",
    "talker_top_p": "the talker's top-p (1.0)",
    "talker_repetition_penalty": "the talker's repetition penalty (1.05)",
    "talker_max_tokens": "frames a reply may speak, 80 ms each (4096)",
    "talker_stream": ar_stream_help("talker"),
    "talker_kv_cache_bytes": "the talker's KV-cache budget (2 GiB on CUDA, 1 GiB on CPU)",
    "audio_first_chunk": "frames before the first audio (4)",
    "audio_chunk": "the most frames a later audio chunk waits for (25)",
    "audio_left_context": "frames code2wav reads before each chunk (25)",
}
