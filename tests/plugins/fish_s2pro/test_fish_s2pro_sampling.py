"""The slow AR's repetition-aware sampling (StepSampler.semantic on the core sampler): a semantic
token already in the row's window is drawn again at temperature 1.0 / top-p 0.9; other tokens,
tokens outside the window and greedy rows are kept; draws repeat with their seeds."""

from __future__ import annotations

import torch
from omni_core.scheduler.sampling_params import SamplingParams
from omni_fish_s2pro.sampling import RAS_WINDOW, StepSampler

BEGIN, END, IM_END, VOCAB = 10, 73, 5, 80
FAVOURED = 20


def _is_semantic(tokens: torch.Tensor) -> torch.Tensor:
    return (tokens >= BEGIN) & (tokens <= END)


def _logits(rows: int, favoured: int) -> torch.Tensor:
    logits = torch.full((rows, VOCAB), float("-inf"))
    logits[:, BEGIN : END + 1] = 0.0
    logits[:, IM_END] = 0.0
    logits[:, favoured] = 4.0
    return logits


def _draw(logits, recent, temperature=0.1, done=7):
    rows = logits.shape[0]
    params = [SamplingParams(temperature=temperature, top_p=1.0, top_k=0)] * rows
    sampler = StepSampler(torch.device("cpu"), num_codebooks=10)
    return sampler.semantic(logits, params, list(range(rows)), [done] * rows, recent, _is_semantic)


def test_a_repeated_semantic_token_is_drawn_again_hotter():
    logits = _logits(48, FAVOURED)
    fresh = torch.full((48, RAS_WINDOW), 30)
    assert (_draw(logits, fresh) == FAVOURED).all()  # cold draws: the favoured token, not in the window
    window = fresh.clone()
    window[:, -1] = FAVOURED
    redrawn = _draw(logits, window)
    assert 5 < int((redrawn != FAVOURED).sum()) < 48  # the hot redraw moves a good part of the rows
    assert (_is_semantic(redrawn) | (redrawn == IM_END)).all()
    assert torch.equal(redrawn, _draw(logits, window))  # the same seeds draw the same tokens


def test_the_end_token_and_greedy_rows_are_never_redrawn():
    logits = _logits(16, IM_END)
    window = torch.full((16, RAS_WINDOW), IM_END)
    assert (_draw(logits, window) == IM_END).all()  # not semantic: kept
    logits = _logits(16, FAVOURED)
    window = torch.full((16, RAS_WINDOW), FAVOURED)
    assert (_draw(logits, window, temperature=0.0) == FAVOURED).all()
