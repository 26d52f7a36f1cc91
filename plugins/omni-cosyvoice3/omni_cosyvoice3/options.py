"""The build options cosyvoice3 reads (``omni serve --option KEY=VALUE``): its FamilySpec declares
them, so a key not named here is refused, and ``omni families cosyvoice3`` prints this table."""

from omni_core.hooks import PREFILL_GRAPHS_HELP, ar_stream_help

_GRAPHS = "{} graphs captured at start-up on CUDA: batch1 (default) | all | none | BxT,... | off (run eagerly)"

OPTIONS = {
    "dtype": "flow (and llm) dtype: float32 (default) | bfloat16 | float16",
    "llm_dtype": "llm dtype (default: dtype)",
    "hift_dtype": "HiFT dtype (default float32; its F0 predictor stays float64)",
    "max_batch": "requests a flow / HiFT call takes, and llm rows (32)",
    "batch_window_ms": "how long the flow and HiFT wait to fill a batch (1)",
    "schedule": "which streams the flow and HiFT serve first: deadline (default: the stream whose listener runs dry soonest; new requests by time waiting) | arrival (oldest message first)",
    "max_hop": "tokens of the largest flow chunk (100)",
    "kv_cache_bytes": "the llm's KV-cache budget (default: half the free GPU memory, 1 GiB on CPU)",
    "cuda_graphs": "CUDA graphs for the llm, flow and HiFT (true)",
    "prefill_graphs": PREFILL_GRAPHS_HELP,
    "llm_stream": ar_stream_help("llm"),
    "min_token_text_ratio": "speech tokens per text token a reply makes at least (2)",
    "max_token_text_ratio": "speech tokens per text token a reply makes at most (20)",
    "min_length_blocks": "what a reply under its minimum cannot draw: reference (6561 alone, default) | all (every stop id)",
    "llm_overlap_decode": "launch each llm decode step before the last one's tokens reach the host (false)",
    "flow_cache_bytes": "bytes of the flow's cache of streamed requests' finished chunks (0: off, default)",
    "flow_cache_graphs": "cached flow calls as CUDA graphs per (batch, queries, keys) bucket where the flow has graphs (false: eager)",
    "flow_last_call": "a streamed request's last flow call: full (attends over all frames, the reference's, default) | masked (the chunk mask, on the cache)",
    "flow_graphs": _GRAPHS.format("flow"),
    "hift_graphs": _GRAPHS.format("HiFT"),
    "flow_graph_frames": "the flow graphs' frame buckets (64,128,...,2048)",
    "hift_graph_frames": "the HiFT graphs' frame buckets (64,128,...,2048)",
    "flow_graph_max_work": "batch x frames past which a flow call runs eagerly (8192)",
    "hift_graph_max_work": "batch x frames past which a HiFT call runs eagerly (8192)",
}
