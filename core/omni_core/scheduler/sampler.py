"""Batched token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeds.

Every filter runs on the whole batch at once from per-sequence parameter tensors. Randomness
is counter-based: a sequence's uniform for a step is a hash of (its seed, its length), so a
seeded request draws the same tokens whatever else shares its batch, with no per-sequence
generator calls on the hot path. A token is drawn by inverting the row's cumulative
distribution at that one uniform (exact up to the float32 rounding of the cumulative sum): one
cumulative sum over the vocabulary, where noise for every vocabulary entry cost a dozen passes
over [B, V] (half a second a step for 32 rows of a 151,936-token vocabulary on one CPU core).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch

from omni_core.models.native import host_ops
from omni_core.scheduler.host_copy import to_device

_MASK32 = 0xFFFFFFFF


@dataclass
class SamplingTensors:
    """Per-sequence parameters of one step, as device tensors ([B] each). An all-greedy batch
    needs none of them (argmax only), so they are left out then."""

    temperature: torch.Tensor | None
    top_k: torch.Tensor | None
    top_p: torch.Tensor | None
    min_p: torch.Tensor | None
    seeds: torch.Tensor | None
    steps: torch.Tensor | None
    all_greedy: bool
    any_top_k: bool
    any_top_p: bool
    any_min_p: bool
    any_greedy: bool = False  # some row has temperature 0 (takes its argmax)
    max_top_k: int = 0  # the largest top_k of the batch (0: none)
    all_top_k: bool = False  # every row has a top_k: the draw looks at the top max_top_k tokens only
    penalty: torch.Tensor | None = None  # [B] where some sequence has repetition_penalty != 1
    seen_tokens: torch.Tensor | None = None  # [B, V] bool: tokens in prompt or output
    seen_lens: list[int] | None = None  # per row, how many of its tokens seen_tokens holds
    banned: torch.Tensor | None = None  # [B, V] bool: stop tokens before min_tokens
    banned_rows: tuple[int, ...] = ()  # the rows still under their min_tokens

    @property
    def argmax_only(self) -> bool:
        """Every row takes its top logit as it is (greedy, no penalty, no banned tokens)."""
        return self.all_greedy and self.penalty is None and self.banned is None


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, vocab: int) -> torch.Tensor:
    """Deterministic uniforms in (0, 1), shape [B, vocab], from 32-bit integer hashing."""
    idx = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    x = (seeds[:, None] * 0x9E3779B1 + steps[:, None] * 0x85EBCA77 + idx[None, :] * 0xC2B2AE3D) & _MASK32
    for mult in (0x7FEB352D, 0x846CA68B):
        x = x ^ (x >> 16)
        x = (x * mult) & _MASK32
    x = x ^ (x >> 16)
    return (x.to(torch.float64) + 0.5) / 4294967296.0


class Sampler:
    def __call__(self, logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
        """logits [B, V] -> token ids [B] (int64)."""
        if t.argmax_only:
            return greedy(logits)  # exact in any float dtype: no float32 copy needed
        logits = logits.float()
        if t.penalty is not None:
            # CTRL-style: shrink seen tokens' logits (divide positives, multiply negatives)
            p = t.penalty[:, None]
            penalised = torch.where(logits > 0, logits / p, logits * p)
            logits = torch.where(t.seen_tokens, penalised, logits)
        if t.banned is not None:
            logits = logits.masked_fill(t.banned, float("-inf"))
        if t.all_greedy:
            return greedy(logits)
        greedy_tokens = greedy(logits) if t.any_greedy else None
        temp = torch.where(t.temperature > 0, t.temperature, torch.ones_like(t.temperature))
        logits = logits / temp[:, None]
        if t.all_top_k and t.max_top_k * TOP_K_FRACTION <= logits.shape[-1]:
            sampled = _sample_among_top_k(logits, t)
            return sampled if greedy_tokens is None else torch.where(t.temperature > 0, sampled, greedy_tokens)
        if t.any_top_k:
            logits = _apply_top_k(logits, t.top_k, t.max_top_k)
        probs = torch.softmax(logits, dim=-1)
        if t.any_top_p:
            probs = _apply_top_p(probs, t.top_p)
        if t.any_min_p:
            floor = t.min_p[:, None] * probs.max(dim=-1, keepdim=True).values
            probs = probs.masked_fill(probs < floor, 0.0)
        sampled = _invert_cdf(probs, uniform_noise(t.seeds, t.steps, 1)[:, 0])
        return sampled if greedy_tokens is None else torch.where(t.temperature > 0, sampled, greedy_tokens)


GREEDY_CHUNK = 256  # columns per chunk of greedy's two-level search on CPU


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first largest logit, as ``argmax`` (for rows without NaN). On CPU torch's argmax
    is a scalar loop (5-8 ms for 32 rows of a 151,936-token vocabulary on one core). float32 rows go
    to the host kernel (one vectorised pass: 0.67 ms there, 43 us for 32 rows of 8192); otherwise
    the maxima of 256-column chunks are a vectorised reduction, and only the first chunk holding the
    row's maximum is searched (0.76 ms and 90 us)."""
    rows, vocab = logits.shape
    if logits.device.type != "cpu":
        return logits.argmax(dim=-1)
    if host_ops.takes(logits):
        return host_ops.argmax_rows(logits)
    if vocab < 2 * GREEDY_CHUNK:
        return logits.argmax(dim=-1)
    whole = vocab // GREEDY_CHUNK * GREEDY_CHUNK
    chunks = logits[:, :whole].view(rows, -1, GREEDY_CHUNK)
    maxima = chunks.amax(dim=-1)
    if whole < vocab:  # the columns past the whole chunks, as one more
        maxima = torch.cat([maxima, logits[:, whole:].amax(dim=-1, keepdim=True)], dim=-1)
    best = maxima.argmax(dim=-1)  # the first chunk holding the maximum
    inside = chunks[torch.arange(rows), best.clamp(max=chunks.shape[1] - 1)].argmax(dim=-1)
    found = best * GREEDY_CHUNK + inside
    if whole < vocab:
        found = torch.where(best == chunks.shape[1], whole + logits[:, whole:].argmax(dim=-1), found)
    return found


def _invert_cdf(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Per row, the first index whose cumulative probability passes ``uniform`` x the row's total
    (probabilities need not sum to one; a zero-probability token is never drawn)."""
    cdf = probs.cumsum(dim=-1)
    total = cdf[:, -1:]
    # strictly below the total, so the index found always has probability above zero
    target = torch.minimum(uniforms.to(cdf.dtype)[:, None] * total, torch.nextafter(total, torch.zeros_like(total)))
    return torch.searchsorted(cdf, target, right=True)[:, 0]


TOP_K_FRACTION = 4  # the candidates path runs while the batch's largest top_k is at most a quarter of the vocabulary


def _sample_among_top_k(logits: torch.Tensor, t: SamplingTensors) -> torch.Tensor:
    """The draw of ``Sampler`` when every row has a top_k, on the batch's ``max_top_k`` most likely
    tokens instead of the whole vocabulary: no softmax, sort or cumulative sum over [B, V] (a dozen
    fewer kernels, which is most of a small-vocabulary draw's cost on a GPU). The kept tokens are
    put back in vocabulary order before the draw, so a seed draws what the whole-vocabulary path
    draws (up to float32 rounding; tokens tied with a row's k-th are cut at k here)."""
    values, ids = logits.topk(t.max_top_k, dim=-1)  # sorted, most likely first
    beyond = torch.arange(t.max_top_k, device=logits.device)[None, :] >= t.top_k[:, None]
    probs = torch.softmax(values.masked_fill(beyond, float("-inf")), dim=-1)
    if t.any_top_p:
        probs = torch.where((t.top_p >= 1)[:, None], probs, _nucleus(probs, t.top_p))
    if t.any_min_p:
        probs = probs.masked_fill(probs < t.min_p[:, None] * probs[:, :1], 0.0)
    ids, order = ids.sort(dim=-1)
    picked = _invert_cdf(probs.gather(-1, order), uniform_noise(t.seeds, t.steps, 1)[:, 0])
    return ids.gather(-1, picked[:, None])[:, 0]


def _apply_top_k(logits: torch.Tensor, top_k: torch.Tensor, max_top_k: int) -> torch.Tensor:
    """Logits below each row's k-th largest set to -inf (rows with top_k 0 untouched); one
    ``topk`` of the batch's largest k instead of a sort of the vocabulary."""
    largest = logits.topk(min(max_top_k, logits.shape[-1]), dim=-1).values
    kth = largest.gather(-1, (top_k.clamp(min=1, max=largest.shape[-1]) - 1)[:, None])
    kth = kth.masked_fill((top_k <= 0)[:, None], float("-inf"))
    return logits.masked_fill(logits < kth, float("-inf"))


TOP_P_CANDIDATES = 1024  # on CPU, top-p first looks at this many most likely tokens per row


def _apply_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Probabilities outside each row's nucleus set to 0: the most likely tokens whose mass
    before them is under top_p. On CPU, where sorting a large vocabulary costs most of a step,
    the nucleus is looked for among the top ``TOP_P_CANDIDATES`` first, then 8x as many (enough
    once their mass reaches top_p in every row: peaked rows need few, near-flat ones many); on
    other devices, and past that, the whole row is sorted (the check would cost a device sync)."""
    vocab = probs.shape[-1]
    candidates = TOP_P_CANDIDATES if probs.device.type == "cpu" else vocab
    keep_all = (top_p >= 1)[:, None]  # rows without top-p keep every token
    while True:
        if candidates >= vocab:
            values, order = probs.sort(dim=-1, descending=True)
            break
        values, order = probs.topk(candidates, dim=-1)
        if bool(((values.sum(dim=-1, keepdim=True) >= top_p[:, None]) | keep_all).all()):
            break
        candidates *= 8
    return torch.where(keep_all, probs, torch.zeros_like(probs).scatter_(-1, order, _nucleus(values, top_p)))


def _nucleus(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass strictly above each token
    return sorted_probs.masked_fill(before >= top_p[:, None], 0.0)  # always keeps the most likely token


def build_sampling_tensors(seqs, vocab: int, device, reuse: SamplingTensors | None = None, ahead: int = 0) -> SamplingTensors:
    """Gather the batch's parameters. ``reuse``: the tensors of an earlier step of the same
    sequences in the same order, whose per-sequence parameters are taken over (only the step
    counters and the token-dependent masks are rebuilt). ``ahead``: tokens each sequence has
    sampled that are not appended yet (a step launched before the previous one's tokens came
    back): they count for the step counters and ``min_tokens``."""
    params = [s.params for s in seqs]
    if reuse is not None:
        # the penalties are the same sequences' parameters; the masks follow their tokens
        t = replace(reuse, seen_tokens=None, seen_lens=None, banned=None, banned_rows=())
        if not t.all_greedy:
            t.steps = to_device(torch.tensor([len(s) + ahead for s in seqs], dtype=torch.int64), device)
    elif all(p.temperature == 0 for p in params):
        t = SamplingTensors(None, None, None, None, None, None, all_greedy=True, any_top_k=False, any_top_p=False, any_min_p=False)
    else:
        # one host-to-device copy for the float parameters and one for the integer ones
        floats = to_device(torch.tensor([[p.temperature for p in params], [p.top_p for p in params], [p.min_p for p in params]], dtype=torch.float32), device)
        ints = to_device(torch.tensor([[p.top_k for p in params], [s.seed for s in seqs], [len(s) + ahead for s in seqs]], dtype=torch.int64), device)
        t = SamplingTensors(
            temperature=floats[0],
            top_k=ints[0],
            top_p=floats[1],
            min_p=floats[2],
            seeds=ints[1],
            steps=ints[2],
            all_greedy=False,
            any_top_k=any(p.top_k > 0 for p in params),
            any_top_p=any(p.top_p < 1 for p in params),
            any_min_p=any(p.min_p > 0 for p in params),
            any_greedy=any(p.temperature == 0 for p in params),
            max_top_k=max(p.top_k for p in params),
            all_top_k=all(p.top_k > 0 for p in params),
        )
    f32 = dict(dtype=torch.float32, device=device)
    if any(p.repetition_penalty != 1.0 for p in params):
        if t.penalty is None:
            t.penalty = torch.tensor([p.repetition_penalty for p in params], **f32)
        t.seen_tokens, t.seen_lens = _seen_tokens(seqs, vocab, device, reuse)
    t.banned_rows = tuple(row for row, s in enumerate(seqs) if s.num_output_tokens + ahead < s.params.min_tokens and s.stop_ids)
    if t.banned_rows and reuse is not None and reuse.banned_rows == t.banned_rows:
        t.banned = reuse.banned  # the same rows under their minimum: the same stop tokens banned
    elif t.banned_rows:
        under = set(t.banned_rows)
        stops = [list(s.stop_ids) if row in under else [] for row, s in enumerate(seqs)]
        t.banned = _mark(torch.zeros(len(seqs), vocab, dtype=torch.bool, device=device), stops, device)
    return t


def _mark(mask: torch.Tensor, ids_per_row: list[list[int]], device) -> torch.Tensor:
    """``mask[row, id] = True`` for each row's ids inside the vocabulary (a prompt may hold ids
    past this head's), in one host-to-device copy and one scatter; returns ``mask``."""
    counts = [len(ids) for ids in ids_per_row]
    if sum(counts):
        cols = torch.tensor(list(itertools.chain.from_iterable(ids_per_row)), dtype=torch.int64)
        rows = torch.repeat_interleave(torch.arange(len(ids_per_row)), torch.tensor(counts))
        inside = (cols >= 0) & (cols < mask.shape[1])
        index = to_device(torch.stack([rows[inside], cols[inside]]), device)
        mask[index[0], index[1]] = True
    return mask


def _seen_tokens(seqs, vocab: int, device, reuse: SamplingTensors | None) -> tuple[torch.Tensor, list[int]]:
    """[B, V] bool: the tokens each sequence has seen (prompt and output; output only for a
    prompt given as embeddings), and how many of each sequence's tokens that covers. The same
    batch as the step before adds only its tokens since then to that step's mask, in one scatter;
    another batch writes all its tokens, also in one."""
    lens = [len(s) for s in seqs]
    if reuse is not None and reuse.seen_tokens is not None:
        seen, starts = reuse.seen_tokens, reuse.seen_lens
    else:
        seen = torch.zeros(len(seqs), vocab, dtype=torch.bool, device=device)
        starts = [0 if s.cacheable else s.num_prompt_tokens for s in seqs]
    new = [s.token_ids[start:n] for s, start, n in zip(seqs, starts, lens, strict=True)]
    return _mark(seen, new, device), lens
