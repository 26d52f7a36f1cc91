"""Prefill/decode hooks: how a family's AR stage steps into the engine loop.

A family passes one ``ARHooks`` object per stage; the engine resolves its methods once and calls
each at most once per engine step, with the whole batch (never per token or per sequence).
Subclass and override what you need; the defaults do nothing.

Order within a step: ``before_prefill`` / ``before_decode`` (may replace ``batch.input_embeds``)
-> model forward -> logits of the sequences that sample this step -> ``sample`` (may replace
the engine's sampler) -> ``post_prefill`` / ``post_decode`` (may add per-sequence tensors to
``batch.step_outputs`` and may return replacement token ids) -> ``on_finish`` per finished request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from omni_core.scheduler.host_copy import to_device


@dataclass
class StepBatch:
    """One engine step as hooks see it.

    Rows of ``input_ids`` / ``input_embeds`` / ``positions`` are packed tokens (``query_lens[b]``
    of sequence ``b``, in batch order). ``sample_index`` lists the batch positions of sequences
    that sample a token this step (all of them in decode; in prefill, those whose prompt is now
    complete); tensors given to ``sample`` and the post hooks have one row per entry of it.
    ``extras[b]`` is sequence ``b``'s request ``extras`` dict, shared with the model.
    ``past_tokens[i]`` lists the prompt ids (when the prompt was ids) and generated ids of
    sampled sequence ``i``; ``recent_tokens(n)`` makes a padded [len(sample_index), n] tensor.
    In a decode step launched before the previous step's tokens reached the host (overlapped
    decode), ``ahead_tokens`` holds those tokens on the device, one per sampled sequence: they
    are not in ``past_tokens`` yet, but ``recent_tokens`` ends with them and
    ``num_output_tokens`` counts them.
    """

    is_prefill: bool
    request_ids: list[str]
    extras: list[dict[str, Any]]
    query_lens: list[int]
    input_ids: torch.Tensor
    input_embeds: torch.Tensor
    positions: torch.Tensor
    sample_index: list[int]
    num_output_tokens: list[int]  # per sampled sequence, before this step's token
    past_tokens: list[list[int]]
    step_outputs: dict[str, torch.Tensor] = field(default_factory=dict)
    ahead_tokens: torch.Tensor | None = None

    def recent_tokens(self, n: int, pad: int = -1) -> torch.Tensor:
        """The last ``n`` generated tokens of each sampled sequence, left-padded with ``pad``
        (ending with ``ahead_tokens`` when the step was launched ahead)."""
        ahead = self.ahead_tokens is not None and n > 0
        known = n - 1 if ahead else n
        rows = [toks[-known:] if known else [] for toks in self.past_tokens]
        out = torch.full((len(rows), known), pad, dtype=torch.int64)
        for i, toks in enumerate(rows):
            if toks:
                out[i, known - len(toks) :] = torch.tensor(toks, dtype=torch.int64)
        out = to_device(out, self.input_ids.device)
        return torch.cat([out, self.ahead_tokens[:, None].to(torch.int64)], dim=1) if ahead else out


class ARHooks:
    """Base class of a stage's hooks; every method is optional."""

    # True when ``sample`` reads generated tokens only through ``batch.recent_tokens`` and their
    # count through ``batch.num_output_tokens``: its decode steps may then be launched before
    # the previous step's tokens reach the host (overlapped decode, docs/engine.md)
    samples_ahead = False
    # True when ``before_decode`` and ``post_decode`` read no generated token on the host (only the
    # step's tensors, its counts, and device state their own earlier calls left: a decode step's
    # hooks run when it is launched): its decode steps may then be launched ahead too
    decodes_ahead = False

    def before_prefill(self, batch: StepBatch) -> None:
        """Runs before a prefill forward; may assign ``batch.input_embeds`` ([T, H])."""

    def before_decode(self, batch: StepBatch) -> None:
        """Runs before a decode forward; ``batch.input_embeds`` holds ``model.embed`` of each
        sequence's last token and may be replaced (e.g. speech tokens through their own table)."""

    def sample(self, batch: StepBatch, logits: torch.Tensor) -> torch.Tensor | None:
        """Replace the engine's sampler: logits [N, V] -> token ids [N]; None to use the default.

        Row ``i`` belongs to the sequence at batch position ``batch.sample_index[i]`` (its request
        ``batch.request_ids[batch.sample_index[i]]``, its extras ``batch.extras[...]`` at the same
        position); ``batch.past_tokens[i]`` and ``batch.num_output_tokens[i]`` are already per
        row. In a prefill step, sequences whose prompt is not complete yet have no row."""
        return None

    def post_prefill(self, batch: StepBatch, hidden: torch.Tensor, logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor | None:
        """After sampling in a prefill step; hidden [N, H] is the last position of each sampled
        sequence. May fill ``batch.step_outputs`` ([N, ...] each) and return new token ids [N]."""
        return None

    def post_decode(self, batch: StepBatch, hidden: torch.Tensor, logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor | None:
        """As ``post_prefill``, for a decode step."""
        return None

    def on_finish(self, request_id: str, extras: dict[str, Any], reason: str) -> None:
        """A request left the engine: ``reason`` is "stop", "length" or "abort"."""


def resolve_hooks(hooks: Any) -> dict[str, Any]:
    """Bound methods a hooks object actually overrides (duck-typed objects work too), so the
    engine skips building ``StepBatch`` data nobody reads."""
    names = ("before_prefill", "before_decode", "sample", "post_prefill", "post_decode", "on_finish")
    resolved = {}
    if hooks is None:
        return resolved
    for name in names:
        fn = getattr(hooks, name, None)
        if fn is None:
            continue
        base = getattr(ARHooks, name)
        if getattr(fn, "__func__", None) is base:
            continue
        resolved[name] = fn
    return resolved
