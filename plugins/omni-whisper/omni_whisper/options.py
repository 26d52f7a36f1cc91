"""The build options whisper reads (``omni serve --option KEY=VALUE``): its FamilySpec declares
them, so a key not named here is refused, and ``omni families whisper`` prints this table."""

OPTIONS = {
    "dtype": "auto (float16 on a GPU, int8 on CPUs with VNNI) | int8 (CPU only) | bfloat16 | float16 | float32",
    "threads": "split (default) | shared: how the encoder and decoder share the CPU's threads (CPU only)",
    "max_batch": "decoder rows (32)",
    "encoder_batch": "requests encoded together (8)",
    "batch_window_ms": "how long the encoder waits to fill a batch (5)",
    "temperature_fallback": "decode a window again at higher temperatures when it fails the checks (false)",
    "cuda_graphs": "decode steps in CUDA graphs on CUDA (true)",
}
