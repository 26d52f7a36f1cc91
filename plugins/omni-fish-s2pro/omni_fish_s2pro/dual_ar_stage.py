"""The ``dual_ar`` stage: the slow AR on the core AR engine, the fast AR inside its steps; one
frame of codes out per step.

Each engine step, for the whole batch at once:

- ``before_decode``: a row's input is its last semantic token's embedding plus its frame's code
  embeddings, scaled (``SlowAR.frame_embeds``);
- ``post_prefill`` / ``post_decode``: the fast AR fills codes 1.. of the frame whose semantic
  token was just sampled, from the slow AR's last hidden state, and the step's frames go to the
  host in one copy (``step_outputs["codes"]``).

A request ends on ``<|im_end|>`` (its frame is not voiced) or at its length limit. When a
preempted request is recomputed, ``before_prefill`` gives its generated rows the same inputs
their decode steps had. A segment of a long text carries the segments spoken before it in its
prompt (``segment_context``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch
from omni_core.hooks import InputTooLarge, InvalidInput
from omni_core.models import lockstep
from omni_core.platforms import platform_for
from omni_core.scheduler.ar_stage import ARStageWorker
from omni_core.scheduler.engine import EngineConfig, EngineRequest
from omni_core.scheduler.executor import Message
from omni_core.scheduler.hooks import ARHooks, StepBatch
from omni_core.scheduler.host_copy import to_device, to_host_later
from omni_core.scheduler.sampling_params import SamplingParams

from .config import TokenIds
from .fast_ar import FastAR
from .fast_ar_graphs import FastARGraphs
from .sampling import RAS_WINDOW, StepSampler
from .segment_context import SpokenSegments, SpokenTurn, with_context
from .slow_ar import SlowAR

# the reference server's defaults, for both ARs as it does (no repetition penalty: the slow AR samples
# repetition-aware, ``sampling``)
DEFAULT_SAMPLING = {"temperature": 0.8, "top_p": 0.8, "top_k": 30}
SAMPLING_KEYS = set(DEFAULT_SAMPLING)


@dataclass
class Speaking:
    """One request's state, shared by the worker and the hooks (``extras["fish"]``)."""

    prompt_len: int
    seed: int
    params: SamplingParams
    prompt_ids: list[int] = field(default_factory=list)  # with the earlier segments it carries
    frames: list[torch.Tensor] = field(default_factory=list)  # per generated step: its codes [num_codebooks]


class DualARHooks(ARHooks):
    # RAS reads its window through batch.recent_tokens, the frame inputs are the device codes
    # the previous step's fast AR appended when it was launched: decode steps may overlap
    samples_ahead = decodes_ahead = True

    def __init__(self, worker: DualARWorker):
        self.w = worker

    def before_prefill(self, batch: StepBatch) -> None:
        """A recomputed request's generated rows get the frame inputs their decode steps had."""
        offset = 0
        for extras, n in zip(batch.extras, batch.query_lens, strict=True):
            state: Speaking = extras["fish"]
            start = int(batch.positions[offset])
            first = max(start, state.prompt_len)
            if state.frames and first < start + n:
                rows = slice(offset + first - start, offset + n)
                steps = range(first - state.prompt_len, start + n - state.prompt_len)
                codes = torch.stack([state.frames[k] for k in steps])
                batch.input_embeds = batch.input_embeds.clone()
                batch.input_embeds[rows] = self.w.slow.frame_embeds(batch.input_embeds[rows], codes)
            offset += n

    def before_decode(self, batch: StepBatch) -> None:
        states: list[Speaking] = [extras["fish"] for extras in batch.extras]
        codes = torch.stack([s.frames[n - 1] for s, n in zip(states, batch.num_output_tokens, strict=True)])
        batch.input_embeds = self.w.slow.frame_embeds(batch.input_embeds, codes)

    def sample(self, batch: StepBatch, logits: torch.Tensor) -> torch.Tensor:
        """Repetition-aware sampling of the semantic tokens (``sampling``)."""
        states: list[Speaking] = [batch.extras[b]["fish"] for b in batch.sample_index]
        return self.w.sample_semantic(
            logits, states, batch.num_output_tokens, batch.recent_tokens(RAS_WINDOW)
        )

    def post_prefill(self, batch, hidden, logits, token_ids):
        self._fill(batch, hidden, token_ids)

    def post_decode(self, batch, hidden, logits, token_ids):
        self._fill(batch, hidden, token_ids)

    def _fill(self, batch: StepBatch, hidden: torch.Tensor, token_ids: torch.Tensor) -> None:
        states: list[Speaking] = [batch.extras[b]["fish"] for b in batch.sample_index]
        codes = self.w.fill_frames(hidden, token_ids, states, batch.num_output_tokens)
        for state, row in zip(states, codes, strict=True):
            state.frames.append(row)
        batch.step_outputs["codes"] = to_host_later(codes)  # one copy for the step, queued before its tokens


@dataclass
class Segment:
    """A segment being spoken: what its turn will be once it ends (``segment_context``)."""

    segment: dict
    turn_ids: list[int]
    codes: list[torch.Tensor] = field(default_factory=list)  # per voiced step: [1, num_codebooks]


class DualARWorker(ARStageWorker):
    """Input: ``prompt`` ({"token_ids", "frames" [num_codebooks, n], "turn_start", "segment",
    "seed", "sampling"}). Output: ``codes`` ({"codes": [frames, num_codebooks]}), one frame a
    step. ``segment_context``: how many earlier segments of a long text a segment's prompt
    carries."""

    def __init__(
        self,
        slow: SlowAR,
        fast: FastAR,
        ids: TokenIds,
        engine_config: EngineConfig,
        max_new_tokens: int = 1024,
        sampling: dict | None = None,
        segment_context: int = 2,
    ):
        super().__init__(slow, engine_config=engine_config)
        self.hooks = DualARHooks(self)
        self.slow, self.fast, self.ids = slow, fast, ids
        self.max_new_tokens = max_new_tokens
        self.defaults = {**DEFAULT_SAMPLING, **(sampling or {})}
        self.device = next(slow.parameters()).device
        self.num_codebooks = slow.num_codebooks
        self.sampling = StepSampler(self.device, self.num_codebooks)
        self.spoken = SpokenSegments(segment_context)
        self.segments: dict[str, Segment] = {}  # request id -> the segment it speaks
        # on CUDA the fast AR runs the core's fused kernels (fast_ar.py), and where the platform
        # captures graphs a step's fast AR is one replay (fast_ar_graphs)
        self.fused_fast = lockstep.fuses(self.device)
        self.fast_graphs = None
        if platform_for(self.device).supports_graphs and self.engine_config.cuda_graphs:
            dtype = next(fast.parameters()).dtype
            self.fast_graphs = FastARGraphs(fast, self.sampling, slow.hidden_size, dtype, self.fused_fast)
            self.fast_graphs.capture(self.engine_config.max_num_seqs, [SamplingParams(**self.defaults)])

    def make_request(self, message: Message) -> EngineRequest:
        p = message.payload
        ids = torch.as_tensor(p["token_ids"], dtype=torch.int64)
        frames = torch.as_tensor(p["frames"], dtype=torch.int64).reshape(self.num_codebooks, -1)
        limit = self.max_model_len or self.slow.config.max_position_embeddings
        if ids.numel() >= limit:  # segments (``segments``) keep text short: the rest is the reference's
            raise InputTooLarge(
                f"fish-s2pro: the prompt (text and reference) is {ids.numel()} tokens; the model holds "
                f"{limit} tokens (max_model_len) with its reply",
                "input",
            )
        segment, turn_start = p.get("segment"), int(p.get("turn_start") or 0)
        if segment and 0 < turn_start < ids.numel() and self.spoken.keep > 0:
            own_turn = ids[turn_start:].tolist()
            carried = self.spoken.before(segment)
            if carried:  # leaving a whole reply's room
                spliced, frames, _ = with_context(
                    ids.tolist(), frames, turn_start, carried, self.ids.semantic_begin,
                    self.ids.turn_end, limit - self.max_new_tokens,
                )  # fmt: skip
                ids = torch.as_tensor(spliced, dtype=torch.int64)
            self.segments[message.request_id] = Segment(segment, own_turn)
        is_frame = (ids >= self.ids.semantic_begin) & (ids <= self.ids.semantic_end)
        if int(is_frame.sum()) != frames.shape[1]:
            raise InvalidInput(
                f"the prompt has {int(is_frame.sum())} semantic tokens but {frames.shape[1]} frames of codes"
            )
        codes = torch.zeros(ids.numel(), self.num_codebooks, dtype=torch.int64)
        codes[is_frame] = frames.T
        embeds = self.slow.prompt_embeds(
            to_device(ids, self.device), to_device(codes, self.device), to_device(is_frame, self.device)
        )
        seed = p.get("seed")
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF if seed is None else int(seed) % (1 << 31)
        params = self._params(p.get("sampling") or {}, seed, limit - ids.numel())
        state = Speaking(prompt_len=ids.numel(), seed=seed, params=params, prompt_ids=ids.tolist())
        return EngineRequest(message.request_id, prompt_embeds=embeds, params=params, extras={"fish": state})

    def _params(self, requested: dict, seed: int, room: int) -> SamplingParams:
        unknown = set(requested) - SAMPLING_KEYS
        if unknown:
            raise InvalidInput(f"unknown sampling options {sorted(unknown)}; known: {sorted(SAMPLING_KEYS)}")
        values = {**self.defaults, **{k: v for k, v in requested.items() if v is not None}}
        try:
            return SamplingParams(
                **values,
                max_tokens=min(self.max_new_tokens, room),
                stop_token_ids=[self.ids.im_end],
                seed=seed,
            )
        except (TypeError, ValueError) as e:
            raise InvalidInput(str(e)) from e

    @torch.inference_mode()
    def fill_frames(
        self, hidden: torch.Tensor, token_ids: torch.Tensor, states: list[Speaking], done: list[int]
    ) -> torch.Tensor:
        """Each row's frame [N, num_codebooks]: its semantic code, then the fast AR's codes."""
        code0 = (token_ids - self.ids.semantic_begin).clamp(0, self.fast.embeddings.num_embeddings - 1)
        if self.fast_graphs is not None:
            return self.fast_graphs(hidden, code0, [s.params for s in states], [s.seed for s in states], done)
        chooser = self.sampling.fast_chooser([s.params for s in states], [s.seed for s in states], done)
        return self.fast(hidden, code0, chooser, fused=self.fused_fast)

    def sample_semantic(
        self, logits: torch.Tensor, states: list[Speaking], done: list[int], recent: torch.Tensor
    ) -> torch.Tensor:
        ids = self.ids
        return self.sampling.semantic(
            logits, [s.params for s in states], [s.seed for s in states], done, recent,
            lambda t: (t >= ids.semantic_begin) & (t <= ids.semantic_end),
        )  # fmt: skip

    def on_output(self, request_id, new_token_ids, finished, step_outputs, emit) -> bool:
        voiced = bool(new_token_ids) and new_token_ids[-1] != self.ids.im_end
        segment = self.segments.get(request_id)
        if segment is not None:
            if voiced:
                segment.codes.append(step_outputs["codes"].to(torch.int64).reshape(1, self.num_codebooks))
            if finished:  # kept before the end goes out: the next segment starts once it is read
                del self.segments[request_id]
                codes = torch.cat([torch.zeros(0, self.num_codebooks, dtype=torch.int64), *segment.codes])
                self.spoken.ended(segment.segment, SpokenTurn(segment.turn_ids, codes.T.contiguous()))
        if voiced:
            emit(
                "codes",
                {"codes": step_outputs["codes"].to(torch.int64).reshape(1, self.num_codebooks)},
                end=finished,
            )
        elif finished:
            emit("codes", {"codes": torch.zeros(0, self.num_codebooks, dtype=torch.int64)}, end=True)
        return False

    def release(self, request_id: str) -> None:
        segment = self.segments.pop(request_id, None)
        if segment is not None:  # the request is over: its later segments are aborted too
            self.spoken.failed(segment.segment)
