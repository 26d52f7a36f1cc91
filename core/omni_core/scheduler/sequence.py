"""A request inside the engine: its tokens, its KV blocks and its progress."""

from __future__ import annotations

import itertools
import random
from enum import Enum, auto
from typing import Any

from omni_core.scheduler.sampling_params import SamplingParams

_seq_counter = itertools.count()


class SequenceStatus(Enum):
    WAITING = auto()
    RUNNING = auto()
    FINISHED = auto()


class Sequence:
    """Prompt plus generated tokens of one request.

    A prompt is token ids, or embeddings ``[L, H]`` (then ``token_ids`` holds ``L`` placeholder
    ids, and the prefix cache skips the prompt, since ids do not identify its content). Nor do
    ids alone identify the KV of a request whose ``extras`` the model may read: such a request is
    prefix-cached only under a ``prefix_key`` naming what its extras change (blocks are shared
    between equal keys only).
    ``num_computed_tokens`` counts tokens whose KV is in the cache; prefill may take several
    steps (chunked) before the first token is sampled.
    """

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int] | None,
        params: SamplingParams,
        prompt_embeds: Any = None,
        extras: dict[str, Any] | None = None,
        hidden_layers: tuple[int, ...] = (),
        eos_token_ids: tuple[int, ...] = (),
        prefix_key: Any = None,
    ):
        if prompt_embeds is not None:
            if prompt_embeds.dim() != 2:
                raise ValueError(f"prompt_embeds must be [length, hidden], got shape {tuple(prompt_embeds.shape)}")
            prompt_token_ids = [0] * prompt_embeds.shape[0]
        if not prompt_token_ids:
            raise ValueError("a prompt needs at least one token or embedding row")
        self.seq_id = next(_seq_counter)
        self.request_id = request_id
        self.token_ids: list[int] = [int(t) for t in prompt_token_ids]
        self.num_prompt_tokens = len(self.token_ids)
        self.prompt_embeds = prompt_embeds
        self.params = params
        self.extras: dict[str, Any] = extras if extras is not None else {}
        self.hidden_layers = tuple(hidden_layers)
        # where the prefix cache's hash chain of this sequence starts (None: not prefix-cached)
        self.prefix_root: int | None = None
        if prompt_embeds is None and (prefix_key is not None or not self.extras):
            self.prefix_root = hash(("prefix", prefix_key))
        stops = set(params.stop_token_ids)
        if not params.ignore_eos:
            stops.update(eos_token_ids)
        self.stop_ids = frozenset(stops)
        self.seed = params.seed if params.seed is not None else random.getrandbits(31)
        self.status = SequenceStatus.WAITING
        self.block_table: list[int] = []
        self.num_hashed_blocks = 0  # leading full blocks registered in the prefix cache
        self.num_computed_tokens = 0
        self.num_scheduled_tokens = 0  # tokens this step computes
        self.finish_reason: str | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def cacheable(self) -> bool:
        return self.prompt_embeds is None

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def num_blocks_for(self, num_tokens: int, block_size: int) -> int:
        return (num_tokens + block_size - 1) // block_size

    def block_tokens(self, index: int, block_size: int) -> list[int]:
        return self.token_ids[index * block_size : (index + 1) * block_size]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def check_stop(self, token_id: int) -> str | None:
        """Why the sequence stops after ``token_id`` was appended, or None."""
        n = self.num_output_tokens
        if n >= self.params.min_tokens and token_id in self.stop_ids:
            return "stop"
        if n >= self.params.max_tokens:
            return "length"
        return None
