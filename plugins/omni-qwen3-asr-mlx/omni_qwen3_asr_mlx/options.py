"""The build options qwen3-asr reads (``omni serve --option KEY=VALUE``): its FamilySpec declares
them, so a key not named here is refused, and ``omni families qwen3-asr`` prints this table."""

OPTIONS = {
    "dtype": "weights and activations (float32 on CPU, bfloat16 on Metal)",
    "max_batch": "decoding rows per step (32)",
    "mlx_device": "cpu | gpu (MLX's default: Metal when present; gpu without a GPU backend fails at start)",
    "chunk_seconds": "longest audio piece decoded as one sequence (30)",
    "max_audio_seconds": "longer audio is rejected (10800)",
    "max_tokens_per_second": "a chunk's token budget is min_new_tokens + this x its seconds (12)",
    "min_new_tokens": "see max_tokens_per_second (32)",
}
