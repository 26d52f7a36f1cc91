"""The fast AR's sampler path rounds the batch's largest top-k up to a power of two (fewer CUDA
graphs to capture) and draws the same codes as with the exact largest top-k."""

from __future__ import annotations

import dataclasses

import torch
from omni_core.scheduler.sampling_params import SamplingParams
from omni_fish_s2pro.sampling import StepSampler


def test_a_rounded_largest_top_k_draws_the_same_codes():
    sampler = StepSampler(torch.device("cpu"), num_codebooks=4)
    params = [SamplingParams(temperature=0.8, top_k=30, top_p=0.9), SamplingParams(temperature=1.0, top_k=7)]
    path = sampler.fast_path(params)
    assert path.max_top_k == 32 and sampler.fast_path([SamplingParams(temperature=1.0, top_k=33)]).max_top_k == 64
    exact = dataclasses.replace(path, max_top_k=30)
    ints, floats = sampler.fast_rows(params, [11, 12], [0, 5])
    g = torch.Generator().manual_seed(0)
    for codebook in range(1, 4):
        logits = torch.randn(2, 256, generator=g)
        rounded = sampler.fast_choose(path, ints, floats)(logits, codebook)
        assert torch.equal(rounded, sampler.fast_choose(exact, ints, floats)(logits, codebook))
