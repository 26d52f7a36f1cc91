"""AREngine: requests in, tokens out, one ``step()`` at a time (the caller owns the loop).

``generate`` submits every prompt at once and steps until all finish (continuous batching);
``omni_core.scheduler.async_engine.AsyncAREngine`` runs the loop in a thread and streams tokens;
the ``ar`` stage executor drives the same ``step()``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omni_core.platforms import platform_for
from omni_core.scheduler.ar_scheduler import Scheduler
from omni_core.scheduler.block_manager import BlockManager
from omni_core.scheduler.hooks import resolve_hooks
from omni_core.scheduler.model_runner import LaunchedStep, ModelRunner
from omni_core.scheduler.sampling_params import SamplingParams
from omni_core.scheduler.sequence import Sequence

DEFAULT_CUDA_GRAPH_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
DEFAULT_PREFILL_GRAPH_TOKENS = (16, 32, 64, 128, 256, 512)
DEFAULT_PREFILL_GRAPH_BATCHES = (1, 4, 8, 16, 32)
ENGINE_STREAMS = ("shared", "own", "high")  # EngineConfig.stream, the default first


@dataclass
class EngineConfig:
    """Engine sizing. The KV cache gets ``num_kv_blocks`` blocks if set, else as many as fit
    in ``kv_cache_bytes``, else in ``kv_cache_fraction`` of the device's free memory (on an
    accelerator: CUDA, XPU) or 1 GiB (CPU). ``max_model_len`` (prompt + output) defaults to the
    model's position limit, capped by the cache size."""

    max_num_seqs: int = 64
    max_num_batched_tokens: int = 4096
    block_size: int = 16
    kv_cache_bytes: int | None = None
    kv_cache_fraction: float = 0.5
    num_kv_blocks: int | None = None
    max_model_len: int | None = None
    dtype: torch.dtype | None = None
    enable_prefix_caching: bool = True
    cuda_graphs: bool = True
    cuda_graph_sizes: tuple[int, ...] = DEFAULT_CUDA_GRAPH_SIZES
    cuda_graph_kv_lens: tuple[int, ...] = (256, 1024)  # graph variants by context length (plus max_model_len)
    # prefill graphs (ModelRunner, scheduler/prefill_graphs.py): padded tokens a prompt and padded
    # prompts a step, for contexts up to the largest of cuda_graph_kv_lens; () prefills eagerly
    cuda_graph_prefill_tokens: tuple[int, ...] = DEFAULT_PREFILL_GRAPH_TOKENS
    cuda_graph_prefill_batches: tuple[int, ...] = DEFAULT_PREFILL_GRAPH_BATCHES
    eos_token_ids: tuple[int, ...] = ()
    attention_backend: Any = None
    # launch each decode step before the previous one's tokens reach the host (see AREngine.step);
    # None: on an accelerator
    overlap_decode: bool | None = None
    # eager prefill passes of several sizes at start-up on an accelerator, for models that take CUDA graphs
    # (ModelRunner.warm_up_prefill)
    warm_up_prefill: bool = True
    # the stream the engine's steps run on (EngineLoop): "shared", the device's default stream;
    # "own", one of its own, so its steps overlap other stages'; "high", its own at the highest
    # priority, so the device starts its kernels ahead of other streams' waiting ones (a stage
    # whose steps bound the audio's latency). No-op on the CPU.
    stream: str = "shared"


@dataclass
class EngineRequest:
    """A request for the engine: prompt ids or prompt embeddings [L, H] (one of them), sampling,
    ``extras`` visible to the model (ForwardContext.extras) and hooks (StepBatch.extras), and
    ``hidden_layers`` to return per step (0: input embeddings, i: output of decoder layer i);
    ``prompt_hidden_layers`` to return for the prompt's positions only (its prefill steps, and
    again if a preempted request is recomputed; decode steps keep their CUDA graphs). Positions
    taken from the prefix cache are not computed, so they return none: a request that needs
    every prompt position's states should not be prefix-cached (no ``prefix_key``).

    ``prefix_key``: for a request with extras, what they change in its KV (any hashable; ``""``
    when the model does not read them, e.g. sampling state for a hook): only requests with equal
    keys share prefix-cached blocks. A request with extras and no key is not prefix-cached (its
    blocks could differ from another's with the same ids); one with prompt embeddings never is.

    ``rope_positions``: the rotary positions of the prompt's tokens where they are not 0..L-1,
    ``[L]`` or ``[axes, L]`` integers (multimodal rotary: Qwen3-Omni's time/height/width
    positions of image and audio tokens). Generated tokens continue one past the largest:
    token ``i`` of the sequence (``i >= L``) is at ``i + max + 1 - L`` on every axis. The model
    then gets such positions instead of 0..n (``[axes, T]`` in a prefill step holding a prompt
    with several axes). Like extras, they change the KV: without a ``prefix_key`` such a request
    is not prefix-cached."""

    request_id: str
    prompt_token_ids: list[int] | None = None
    prompt_embeds: torch.Tensor | None = None
    params: SamplingParams = field(default_factory=SamplingParams)
    extras: dict[str, Any] = field(default_factory=dict)
    hidden_layers: tuple[int, ...] = ()
    prefix_key: Any = None
    rope_positions: torch.Tensor | None = None
    prompt_hidden_layers: tuple[int, ...] = ()


@dataclass
class RequestOutput:
    """What one step produced for one request: ``new_token_ids`` (0 or 1 token) and
    ``step_outputs`` (``hidden_states`` {layer: [n, H]}, tensors hooks added)."""

    request_id: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    step_outputs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerationOutput:
    request_id: str
    token_ids: list[int]
    finish_reason: str | None


class AREngine:
    def __init__(self, model, config: EngineConfig | None = None, hooks: Any = None, device: str | torch.device = "cpu"):
        self.config = config = config or EngineConfig()
        if config.stream not in ENGINE_STREAMS:
            raise ValueError(f"EngineConfig.stream must be one of {', '.join(ENGINE_STREAMS)}, got {config.stream!r}")
        self.device = torch.device(device)
        self.platform = platform_for(self.device)
        self.dtype = config.dtype or next(model.parameters()).dtype
        self.model = model
        self.hooks = resolve_hooks(hooks)
        per_block = ModelRunner.kv_bytes_per_block(model, config.block_size, self.dtype)
        num_blocks = config.num_kv_blocks or max(1, self._kv_budget() // per_block)
        model_limit = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 1 << 30
        self.max_position = model_limit  # rotary positions must stay below it
        self.max_model_len = min(config.max_model_len or model_limit, model_limit, num_blocks * config.block_size)
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens)
        graph_sizes = tuple(s for s in config.cuda_graph_sizes if s <= config.max_num_seqs) if config.cuda_graphs else ()
        prefill_sizes = tuple(s for s in config.cuda_graph_prefill_tokens if s <= config.max_num_batched_tokens) if config.cuda_graphs else ()
        prefill_batches = tuple(b for b in config.cuda_graph_prefill_batches if b <= config.max_num_seqs)
        self.runner = ModelRunner(model, num_blocks, config.block_size, self.device, self.dtype, self.hooks, config.attention_backend, self.max_model_len,
                                  graph_sizes, config.cuda_graph_kv_lens, prefill_sizes, prefill_batches)
        # only a model whose forward reads nothing but its tensors (as in a graph) runs without a request
        if config.warm_up_prefill and self.platform.accelerator and getattr(model, "supports_cuda_graphs", False):
            self.runner.warm_up_prefill(config.max_num_batched_tokens)
        self.eos_token_ids = tuple(config.eos_token_ids)
        self.requests: dict[str, Sequence] = {}
        overlap = config.overlap_decode if config.overlap_decode is not None else self.platform.accelerator
        # hooks that read or replace a step's tokens on the host need them before the next step
        # (a sampler that reads them through batch.recent_tokens says so: samples_ahead; hooks
        # around the forward that read only the device: decodes_ahead)
        host_hooks = (() if getattr(hooks, "decodes_ahead", False) else ("before_decode", "post_decode")) + (
            () if getattr(hooks, "samples_ahead", False) else ("sample",)
        )
        self.overlap_decode = overlap and not any(h in self.hooks for h in host_hooks)
        self.in_flight: LaunchedStep | None = None  # a decode step whose tokens are not applied yet
        self.last_step: tuple[str, int] = ("none", 0)  # the kind of the last step and its sequences, for the step log

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu", dtype: torch.dtype | None = None, hooks: Any = None, **config_kwargs) -> AREngine:
        """An engine over a Qwen2 / Qwen3 / Qwen3-MoE checkpoint directory (config.json + safetensors)."""
        from omni_core.models.registry import load_causal_lm

        model = load_causal_lm(path, device=device, dtype=dtype)
        config = EngineConfig(**config_kwargs)
        if not config.eos_token_ids:
            config.eos_token_ids = _eos_ids(path, model.config)
        return cls(model, config, hooks=hooks, device=device)

    def _kv_budget(self) -> int:
        if self.config.kv_cache_bytes is not None:
            return self.config.kv_cache_bytes
        if self.platform.accelerator:
            free = self.platform.memory_info(self.device.index).free_bytes  # None: the current device
            return int(free * self.config.kv_cache_fraction)
        return 1 << 30

    # ---- requests ---------------------------------------------------------------------------

    def add_request(self, request: EngineRequest) -> None:
        """Queue a request; raises ValueError (and changes nothing) if it cannot ever run."""
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already running")
        if (request.prompt_token_ids is None) == (request.prompt_embeds is None):
            raise ValueError("give exactly one of prompt_token_ids and prompt_embeds")
        hidden = getattr(self.model, "hidden_size", None)
        if request.prompt_embeds is not None and hidden and request.prompt_embeds.shape[-1] != hidden:
            raise ValueError(f"prompt_embeds width {request.prompt_embeds.shape[-1]} != model hidden size {hidden}")
        num_layers = getattr(getattr(self.model, "kv_cache_spec", None), "num_layers", None)
        if num_layers is not None and any(not 0 <= layer <= num_layers for layer in request.hidden_layers + request.prompt_hidden_layers):
            raise ValueError(f"hidden_layers must be in [0, {num_layers}] (0: input embeddings)")
        seq = Sequence(request.request_id, request.prompt_token_ids, request.params, request.prompt_embeds, request.extras, request.hidden_layers,
                       self.eos_token_ids, request.prefix_key, request.rope_positions, request.prompt_hidden_layers)
        vocab = self._vocab_size()
        if request.prompt_token_ids is not None and vocab and any(not 0 <= t < vocab for t in seq.token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab}) (the vocab size)")
        if len(seq) + request.params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt ({len(seq)} tokens) + max_tokens ({request.params.max_tokens}) exceeds the engine's max_model_len {self.max_model_len}")
        axes = 1 if seq.rope_positions is None else seq.rope_positions.shape[0]
        if axes > 1 and axes != getattr(self.model, "rope_axes", 1):
            raise ValueError(f"rope_positions have {axes} axes; the model's rotary takes {getattr(self.model, 'rope_axes', 1)}")
        if len(seq) + request.params.max_tokens + seq.rope_delta > self.max_position:
            raise ValueError(f"rotary positions of prompt + max_tokens would pass the model's {self.max_position} positions")
        self.requests[seq.request_id] = seq
        self.scheduler.add(seq)

    def abort(self, request_id: str) -> bool:
        """Drop a request and free its KV blocks now; False if it is unknown or already done."""
        seq = self.requests.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, "abort")
        self._on_finish(seq)
        return True

    def reset_prefix_cache(self) -> int:
        """Drop the prefix cache's free blocks (running requests keep theirs); returns how many."""
        return self.block_manager.reset_prefix_cache()

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def has_runnable(self) -> bool:
        """Whether a step can do anything now (every unfinished request may be paused)."""
        return self.scheduler.has_runnable()

    def pause(self, request_id: str) -> None:
        """Leave a request out of steps until ``resume``, keeping its KV blocks: it waits for
        input from outside (a stream it is fed from). Unknown ids are ignored."""
        seq = self.requests.get(request_id)
        if seq is not None:
            seq.paused = True

    def resume(self, request_id: str) -> None:
        seq = self.requests.get(request_id)
        if seq is not None:
            seq.paused = False

    # ---- stepping ---------------------------------------------------------------------------

    def step(self) -> list[RequestOutput]:
        """Runs one step and returns what it produced.

        With ``overlap_decode``, a decode step is launched and, before its tokens are read, the
        next decode step of the same sequences is launched on top of it, taking those tokens
        from the device: the host's work for one step (reading tokens, stop checks, outputs,
        scheduling and inputs of the next) runs while the device computes the next. So one
        decode step is usually in flight between calls. A sequence that stops on a token
        computes one more, which is dropped; new requests, preemption and anything that needs
        the tokens on the host first (hooks, repetition penalty, hidden states) wait for the
        step in flight to finish and then run as usual.
        """
        if self.in_flight is not None:
            self.last_step = ("decode", len(self.in_flight.seqs))
            return self._finish_in_flight()
        seqs, is_prefill = self.scheduler.schedule()
        self.last_step = ("prefill" if is_prefill else "decode", len(seqs))
        if not seqs:
            if self.scheduler.has_runnable():
                raise RuntimeError("the engine cannot schedule any request: the KV cache is too small")
            return []
        if not is_prefill and self._overlaps(seqs):
            self.in_flight = self.runner.launch(seqs, False)
            return self._finish_in_flight()
        sample_index, tokens, step_tensors = self.runner.run(seqs, is_prefill)
        return self._apply(seqs, is_prefill, sample_index, tokens, step_tensors)

    def _finish_in_flight(self) -> list[RequestOutput]:
        """Launch the next decode step on top of the one in flight, then apply the latter's tokens."""
        current, self.in_flight = self.in_flight, None  # a failed launch leaves nothing in flight
        # current's sequences passed _overlaps when it was launched, and the step ahead takes a subset
        ahead = self.scheduler.schedule_ahead(current.seqs)
        if ahead:
            self.in_flight = self.runner.launch(ahead, False, ahead_of=current)
        sample_index, tokens, step_tensors = current.result()
        return self._apply(current.seqs, False, sample_index, tokens, step_tensors)

    def _overlaps(self, seqs: list[Sequence]) -> bool:
        return self.overlap_decode and all(not s.hidden_layers and s.params.repetition_penalty == 1.0 for s in seqs)

    def _apply(self, seqs: list[Sequence], is_prefill: bool, sample_index: list[int], tokens: list[int], step_tensors: dict) -> list[RequestOutput]:
        """Advance ``seqs`` by a step's tokens; outputs for the caller. Sequences that finished
        (or were aborted) while the step was in flight are skipped, their token dropped."""
        sampled = {seqs[b].seq_id: tok for b, tok in zip(sample_index, tokens, strict=True)}
        live = [s for s in seqs if not s.is_finished]
        live_ids = {s.seq_id for s in live}
        finished = self.scheduler.postprocess(live, is_prefill, sampled)
        outputs = []
        for b, seq in enumerate(seqs):
            token = sampled.get(seq.seq_id)
            if seq.seq_id not in live_ids or (token is None and b not in step_tensors):
                continue
            outputs.append(RequestOutput(seq.request_id, [] if token is None else [token], seq.is_finished, seq.finish_reason, step_tensors.get(b, {})))
        for seq in finished:
            self.requests.pop(seq.request_id, None)
            self._on_finish(seq)
        return outputs

    def _on_finish(self, seq: Sequence) -> None:
        hook = self.hooks.get("on_finish")
        if hook is not None:
            hook(seq.request_id, seq.extras, seq.finish_reason)

    def generate(self, prompts: list[list[int]], params: SamplingParams | list[SamplingParams] | None = None) -> list[GenerationOutput]:
        """Run all prompts together to completion; one output per prompt, in order."""
        params = params or SamplingParams()
        plist = params if isinstance(params, list) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError("give one SamplingParams or one per prompt")
        ids = [f"generate-{uuid.uuid4().hex}" for _ in prompts]
        added = []
        try:
            for rid, prompt, p in zip(ids, prompts, plist, strict=True):
                self.add_request(EngineRequest(rid, prompt_token_ids=list(prompt), params=p))
                added.append(rid)
        except Exception:
            for rid in added:
                self.abort(rid)
            raise
        results = {rid: [] for rid in ids}
        reasons: dict[str, str | None] = {}
        try:
            while self.has_unfinished():
                for out in self.step():
                    if out.request_id in results:
                        results[out.request_id].extend(out.new_token_ids)
                        if out.finished:
                            reasons[out.request_id] = out.finish_reason
        except BaseException:
            for rid in ids:  # leave no blocks behind (KeyboardInterrupt included)
                self.abort(rid)
            raise
        return [GenerationOutput(rid, results[rid], reasons.get(rid)) for rid in ids]

    def stats(self) -> dict[str, float]:
        bm = self.block_manager
        return {
            "running": len(self.scheduler.running) + len(self.scheduler.prefilling),
            "waiting": len(self.scheduler.waiting),
            "kv_blocks_total": bm.num_blocks,
            "kv_blocks_free": bm.num_free_blocks,
            "kv_usage": 1 - bm.num_free_blocks / bm.num_blocks,
            "prefix_cache_hit_tokens": bm.prefix_hits,
            "preemptions": self.scheduler.num_preemptions,
        }

    def _vocab_size(self) -> int | None:
        cfg = getattr(self.model, "config", None)
        return getattr(cfg, "vocab_size", None)


def _eos_ids(path, config) -> tuple[int, ...]:
    ids: list[int] = []
    try:
        from transformers import GenerationConfig

        gen = GenerationConfig.from_pretrained(str(path))
        value = gen.eos_token_id
    except (OSError, ValueError):
        value = getattr(config, "eos_token_id", None)
    if value is not None:
        ids = list(value) if isinstance(value, (list, tuple)) else [value]
    return tuple(int(i) for i in ids)
