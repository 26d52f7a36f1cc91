"""The batched sampler: filters, exact sampling distribution, seeds independent of the batch."""

from dataclasses import replace

import pytest
import torch
from omni_core.scheduler import AREngine, EngineConfig, SamplingParams
from omni_core.scheduler.sampler import Sampler, build_sampling_tensors
from omni_core.scheduler.sequence import Sequence

LOGITS = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]))


def draw(params: SamplingParams, n: int = 6000, logits=LOGITS) -> torch.Tensor:
    """n draws, each by its own sequence (distinct seeds), in one batched call."""
    seqs = [Sequence(f"s{i}", [1], SamplingParams(**{**params.__dict__, "seed": i})) for i in range(n)]
    t = build_sampling_tensors(seqs, logits.shape[0], "cpu")
    return Sampler()(logits.expand(n, -1).clone(), t)


def frequencies(tokens, vocab=5):
    return torch.bincount(tokens, minlength=vocab).float() / len(tokens)


def test_temperature_one_samples_the_softmax():
    freq = frequencies(draw(SamplingParams(temperature=1.0)))
    torch.testing.assert_close(freq, LOGITS.softmax(-1), atol=0.02, rtol=0)


def test_temperature_sharpens():
    freq = frequencies(draw(SamplingParams(temperature=0.5)))
    torch.testing.assert_close(freq, (LOGITS / 0.5).softmax(-1), atol=0.02, rtol=0)


@pytest.mark.parametrize(
    "params, expected",
    [
        (SamplingParams(top_k=2), [2 / 3, 1 / 3, 0, 0, 0]),
        (SamplingParams(top_p=0.8), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0]),
        (SamplingParams(min_p=0.25), [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0, 0]),
        (SamplingParams(top_k=1), [1, 0, 0, 0, 0]),
        (SamplingParams(temperature=0), [1, 0, 0, 0, 0]),
    ],
)
def test_filters_renormalise_what_they_keep(params, expected):
    freq = frequencies(draw(params))
    torch.testing.assert_close(freq, torch.tensor(expected, dtype=torch.float32), atol=0.025, rtol=0)


def test_repetition_penalty_demotes_seen_tokens():
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5]])
    seq = Sequence("s", [0], SamplingParams(temperature=0, repetition_penalty=1.2))
    assert Sampler()(logits, build_sampling_tensors([seq], 4, "cpu")).tolist() == [1]  # 2.0 / 1.2 < 1.9
    seq = Sequence("s", [3], SamplingParams(temperature=0, repetition_penalty=1.2))
    assert Sampler()(logits, build_sampling_tensors([seq], 4, "cpu")).tolist() == [0]


def test_seen_tokens_exclude_embedded_prompts_and_ids_past_the_vocab():
    # a prompt given as embeddings has no ids to penalise (its placeholders are not tokens); a
    # prompt id past this head's vocab (another vocab's token) is skipped, not an index error
    penalised = SamplingParams(temperature=0, repetition_penalty=1.5)
    by_ids = Sequence("i", [2, 9, 40], penalised)
    by_embeds = Sequence("e", None, penalised, prompt_embeds=torch.zeros(3, 4))
    for s in (by_ids, by_embeds):
        s.append_token(5)
    t = build_sampling_tensors([by_ids, by_embeds], 16, "cpu")
    assert t.seen_tokens.nonzero().tolist() == [[0, 2], [0, 5], [0, 9], [1, 5]]
    by_embeds.append_token(7)  # the same batch next step: only the new token is added
    assert build_sampling_tensors([by_ids, by_embeds], 16, "cpu", reuse=t).seen_tokens.nonzero().tolist() == [[0, 2], [0, 5], [0, 9], [1, 5], [1, 7]]


@pytest.mark.parametrize("vocab", [10, 100, 1024, 1100])  # below a vector, below the chunked path, whole chunks, a tail
def test_greedy_takes_the_first_largest_logit_as_argmax_does(vocab):
    """float32 rows on the host kernel (where built), bfloat16 on the chunked search."""
    from omni_core.scheduler.sampler import GREEDY_CHUNK, greedy

    logits = torch.randn(8, vocab, generator=torch.Generator().manual_seed(3))
    ties = torch.zeros(6, vocab)
    ties[5, [3, 19 % vocab]] = 4.0  # one lane of two vectors
    ties[0, [7, vocab - 1]] = 1.0  # across chunks (and into the tail)
    inside = min(GREEDY_CHUNK, vocab) - 1
    ties[1, [inside - 1, inside]] = 2.0  # inside one chunk
    ties[2, vocab - 1] = 3.0  # only in the last column
    ties[3] = float("-inf")
    ties[3, vocab // 2] = -1.0  # everything else -inf; row 4: all equal
    for rows in (logits, ties, logits.bfloat16()):
        assert torch.equal(greedy(rows), rows.argmax(dim=-1))


def _nucleus_by_sorting(probs, top_p):
    values, order = probs.sort(dim=-1, descending=True)
    values = values.masked_fill(values.cumsum(-1) - values >= top_p[:, None], 0.0)
    # top_p 1 keeps every token (a float32 cumulative sum can reach 1 before the last ones)
    return torch.where((top_p >= 1)[:, None], probs, torch.zeros_like(probs).scatter_(-1, order, values))


@pytest.mark.parametrize("scale", [12.0, 2.0, 0.1])  # peaked, wide, near flat: found among 1024, 8192, or by the full sort
def test_top_p_among_candidates_equals_sorting_the_vocabulary(scale):
    from omni_core.scheduler.sampler import TOP_P_CANDIDATES, _apply_top_p

    probs = (torch.randn(4, 20 * TOP_P_CANDIDATES, generator=torch.Generator().manual_seed(1)) * scale).softmax(-1)
    top_p = torch.tensor([0.5, 0.9, 0.95, 1.0])  # the last row keeps all its tokens
    out = _apply_top_p(probs, top_p)
    torch.testing.assert_close(out, _nucleus_by_sorting(probs, top_p), rtol=0, atol=0)
    assert torch.equal(out[3], probs[3])


def test_top_k_per_row_with_rows_that_keep_everything():
    from omni_core.scheduler.sampler import _apply_top_k

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(2))
    out = _apply_top_k(logits, torch.tensor([0, 3, 7]), max_top_k=7)
    assert torch.equal(out[0], logits[0])
    for row, k in ((1, 3), (2, 7)):
        kept = out[row].isfinite().nonzero()[:, 0]
        assert set(kept.tolist()) == set(logits[row].topk(k).indices.tolist())


def test_inverting_the_distribution_never_draws_a_zero_probability_token():
    from omni_core.scheduler.sampler import _invert_cdf

    probs = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0], [0.0, 0.0, 1.0, 0.0, 0.0]])
    for u in (1e-12, 0.3, 0.30000001, 0.999999999999):
        drawn = _invert_cdf(probs, torch.tensor([u, u], dtype=torch.float64))
        assert drawn[1] == 2 and drawn[0] in (1, 3)
        assert drawn[0] == (1 if u < 0.3 else 3)


def test_seeded_requests_ignore_their_batch_mates(tiny_model):
    params = SamplingParams(temperature=1.0, top_p=0.9, max_tokens=12, seed=1234, ignore_eos=True)
    alone = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=128)).generate([[9, 8, 7]], params)[0].token_ids
    others = [SamplingParams(temperature=1.0, max_tokens=n, seed=n) for n in (3, 20, 7)]
    engine = AREngine(tiny_model, EngineConfig(block_size=4, num_kv_blocks=128))
    mixed = engine.generate([[1, 2], [9, 8, 7], [5] * 9, [4, 4]], [others[0], params, others[1], others[2]])
    assert mixed[1].token_ids == alone
    different_seed = SamplingParams(**{**params.__dict__, "seed": 99})
    assert engine.generate([[9, 8, 7]], different_seed)[0].token_ids != alone


def test_invalid_params_raise():
    for bad in (dict(temperature=-1), dict(top_p=0), dict(max_tokens=0), dict(min_tokens=5, max_tokens=2), dict(repetition_penalty=0)):
        with pytest.raises(ValueError):
            SamplingParams(**bad)


@pytest.mark.parametrize(
    "row_params",
    [
        [dict(top_k=50)] * 3,
        [dict(top_k=50, top_p=0.8), dict(top_k=20, top_p=0.5), dict(top_k=50, top_p=1.0)],
        [dict(top_k=30, min_p=0.05, temperature=0.7), dict(top_k=50, temperature=0), dict(top_k=5, top_p=0.9, temperature=1.3)],
    ],
)
def test_drawing_among_the_top_k_draws_what_the_whole_vocabulary_does(row_params):
    """Every row with a top_k takes the candidates path; the same seeds draw the same tokens as
    the whole-vocabulary path over hundreds of draws."""
    vocab, draws = 2048, 256
    logits = torch.randn(draws * len(row_params), vocab, generator=torch.Generator().manual_seed(5)) * 3
    seqs = [Sequence(f"s{i}", [1], SamplingParams(**{"temperature": 1.0, **row_params[i % len(row_params)], "seed": i})) for i in range(logits.shape[0])]
    candidates = build_sampling_tensors(seqs, vocab, "cpu")
    assert candidates.all_top_k
    whole = replace(candidates, all_top_k=False)
    drawn = Sampler()(logits.clone(), candidates)
    assert torch.equal(drawn, Sampler()(logits.clone(), whole))
    # the draws are spread over the candidates, not stuck on the most likely one
    assert (drawn != logits.argmax(-1)).float().mean() > 0.3


def test_a_row_without_top_k_keeps_the_whole_vocabulary_path():
    seqs = [Sequence("a", [1], SamplingParams(temperature=1.0, top_k=50, seed=1)), Sequence("b", [1], SamplingParams(temperature=1.0, seed=2))]
    assert not build_sampling_tensors(seqs, 2048, "cpu").all_top_k
