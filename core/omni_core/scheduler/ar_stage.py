"""What an ``ar`` stage's factory returns: the model, its hooks, the engine sizing, and the
translation between stage messages and engine requests.

The model follows the ARModel protocol (the shared Qwen backbones do, and so can a family's own
layer stack):

- ``embed(token_ids [T]) -> [T, H]``
- ``forward(embeds [T, H], positions [T], ctx: ForwardContext) -> hidden [T, H]``; each layer
  calls ``ctx.attention(layer_index, q, k, v)`` for paged self-attention and may read
  ``ctx.extras`` (per-sequence dicts, batch order) and ``ctx.query_lens``;
- ``compute_logits(hidden [N, H]) -> [N, V]``
- ``kv_cache_spec`` (``KVCacheSpec(num_layers, num_kv_heads, head_dim)``), ``hidden_size``,
  optional ``supports_cuda_graphs`` (True only if forward depends on nothing but its tensors:
  decode and short prefills then run in CUDA graphs), and optional
  ``reads_extras_in_prefill(extras) -> bool`` where a prefill with some extras reads more (that
  step runs eagerly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_core.scheduler.engine import EngineConfig, EngineRequest
from omni_core.scheduler.executor import Message
from omni_core.scheduler.sampling_params import SamplingParams

# emit(port, payload, end=False): the request id is bound by the executor
Emit = Callable[..., None]

_SAMPLING_KEYS = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "max_tokens", "min_tokens", "stop_token_ids", "ignore_eos", "seed"}


def sampling_from_payload(values: dict[str, Any] | None) -> SamplingParams:
    """SamplingParams from a payload's ``sampling`` dict; unknown keys are an error."""
    values = dict(values or {})
    unknown = set(values) - _SAMPLING_KEYS
    if unknown:
        raise ValueError(f"unknown sampling options {sorted(unknown)}; known: {sorted(_SAMPLING_KEYS)}")
    return SamplingParams(**{k: v for k, v in values.items() if v is not None})


class ARStageWorker:
    """An AR stage. Pass callables or subclass and override ``make_request`` / ``on_output``.

    Defaults: the input payload carries ``prompt_token_ids`` (list of ints) or ``prompt_embeds``
    (tensor [L, H]), an optional ``sampling`` dict and ``hidden_layers``; each new token is
    emitted on port ``tokens`` as ``{"token_ids": [...]}``, the last message with ``end=True``.

    ``on_output`` may end a request before the engine does (a stop string found in the text):
    it emits its last messages and returns True; the engine then drops the request and frees
    its KV blocks. ``max_model_len`` (prompt + output tokens the engine takes) and ``engine``
    are set once the engine is built, before the first request.

    A stage fed by a stream edge gets the stream's first chunk in ``make_request`` and each later
    one in ``on_input`` (chunks of requests the engine no longer holds are dropped). A request
    that needs a chunk that has not come yet is paused (``self.engine.pause(request_id)``: it
    sits out the steps, keeping its KV blocks unless a step lacks them) and resumed when the chunk comes
    (``self.engine.resume``). ``make_request``, ``on_input``, ``on_output`` and ``release`` all
    run on the engine's thread.
    """

    max_model_len: int | None = None
    engine: Any = None

    def __init__(
        self,
        model: torch.nn.Module,
        hooks: Any = None,
        engine_config: EngineConfig | None = None,
        make_request: Callable[[Message], EngineRequest] | None = None,
        on_output: Callable[[str, list[int], bool, dict[str, Any], Emit], None] | None = None,
    ):
        self.model = model
        self.hooks = hooks
        self.engine_config = engine_config or EngineConfig()
        if make_request is not None:
            self.make_request = make_request  # type: ignore[method-assign]
        if on_output is not None:
            self.on_output = on_output  # type: ignore[method-assign]

    def make_request(self, message: Message) -> EngineRequest:
        payload = message.payload
        embeds = payload.get("prompt_embeds")
        ids = payload.get("prompt_token_ids")
        if embeds is not None and not isinstance(embeds, torch.Tensor):
            embeds = torch.as_tensor(embeds)
        return EngineRequest(
            request_id=message.request_id,
            prompt_token_ids=None if ids is None else [int(t) for t in ids],
            prompt_embeds=embeds,
            params=sampling_from_payload(payload.get("sampling")),
            hidden_layers=tuple(payload.get("hidden_layers", ())),
        )

    def on_output(self, request_id: str, new_token_ids: list[int], finished: bool, step_outputs: dict[str, Any], emit: Emit) -> bool | None:
        if new_token_ids or finished:
            emit("tokens", {"token_ids": list(new_token_ids)}, end=finished)

    def on_input(self, message: Message) -> None:
        """A later chunk of the stream a running request is fed from (see the class doc)."""
        raise ValueError(f"stage takes one message a request; got chunk {message.seq} on {message.port!r}")

    def release(self, request_id: str) -> None:
        """Free what ``make_request`` kept for a request that ends without its last output: it
        was aborted, the engine refused it, or a step or ``on_output`` failed. Runs on the
        engine's thread, like ``make_request`` and ``on_output``. It may run more than once for
        a request (a failure, then the pipeline's abort) and for one that already ended with its
        last output (an abort that arrives after it): free with ``dict.pop(request_id, None)``."""
