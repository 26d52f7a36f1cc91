"""A request inside the engine: its tokens, its KV blocks and its progress."""

from __future__ import annotations

import itertools
import random
from enum import Enum, auto
from typing import Any

import torch

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
    steps (chunked) before the first token is sampled. ``prompt_hidden_layers``: hidden layers
    returned for the prompt's positions only (prefill steps).
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
        rope_positions: Any = None,
        prompt_hidden_layers: tuple[int, ...] = (),
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
        self.prompt_hidden_layers = tuple(prompt_hidden_layers)
        # rotary positions of the prompt ([axes, L] int64) where they are not 0..L-1, and the
        # offset of generated tokens' positions from their index (EngineRequest.rope_positions)
        self.rope_positions = None
        self.rope_delta = 0
        if rope_positions is not None:
            self.rope_positions, self.rope_delta = _rope_positions(rope_positions, self.num_prompt_tokens)
        # where the prefix cache's hash chain of this sequence starts (None: not prefix-cached)
        self.prefix_root: int | None = None
        if prompt_embeds is None and (prefix_key is not None or (not self.extras and rope_positions is None)):
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
        # a running sequence that waits for input from outside (a stream it is fed from): it
        # is left out of steps until resumed, and preempted first when blocks run out (AREngine.pause)
        self.paused = False

    def __len__(self) -> int:
        return len(self.token_ids)

    def rotary_positions(self, start: int, stop: int) -> torch.Tensor:
        """Rotary positions of tokens ``start:stop``: ``[axes, n]`` with ``rope_positions``, else ``[n]``."""
        index = torch.arange(start, stop, dtype=torch.int64)
        if self.rope_positions is None:
            return index + self.rope_delta
        axes, prompt = self.rope_positions.shape
        out = (index + self.rope_delta).expand(axes, -1).clone()
        inside = min(stop, prompt)
        if start < inside:
            out[:, : inside - start] = self.rope_positions[:, start:inside]
        return out[0] if axes == 1 else out

    def capture_layers(self, is_prefill: bool) -> tuple[int, ...]:
        """The hidden layers a step of this sequence returns."""
        if is_prefill and self.prompt_hidden_layers and self.num_computed_tokens < self.num_prompt_tokens:
            return tuple(dict.fromkeys(self.hidden_layers + self.prompt_hidden_layers))
        return self.hidden_layers

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


def _rope_positions(positions: Any, prompt_len: int) -> tuple[torch.Tensor, int]:
    """(``[axes, L]`` int64 positions, offset of generated tokens) from ``[L]`` or ``[axes, L]``."""
    positions = torch.as_tensor(positions).to("cpu", torch.int64)
    if positions.dim() == 1:
        positions = positions[None]
    if positions.dim() != 2 or positions.shape[1] != prompt_len:
        raise ValueError(f"rope_positions must be [{prompt_len}] or [axes, {prompt_len}], got shape {tuple(positions.shape)}")
    if int(positions.min()) < 0:
        raise ValueError("rope_positions must not be negative")
    return positions.contiguous(), int(positions.max()) + 1 - prompt_len
