"""The ``talker`` stage: the talker on the core AR engine, fed by the thinker's stream, with the
code predictor inside its steps; one frame of codes out per step.

A request starts with the thinker's first chunk (the talker plan, the thinker's states at the
user turns' media rows, and the assistant turn's ids so far) and takes the reply's later ids as
they come (``on_input``). Each step, for the whole batch at once:

- ``before_decode``: a row's input is its last code's embedding (the engine's lookup) plus the
  sum of that frame's residual code embeddings plus the projected embedding of the reply token
  this step reads (``speech.trailing_id``);
- ``post_prefill`` / ``post_decode``: the code predictor fills codebooks 1.. of the frame whose
  first code was just sampled, from the talker's last hidden state.

A request whose next reply token has not come is paused (it sits out the steps, keeping its KV
blocks unless others need them) and resumed by the chunk that brings it. Each step's frame is
sent as it comes, but the last one (the codec's eos, or the length limit's), which is never
voiced, as the reference does. When a preempted request is recomputed, ``before_prefill`` adds
the same sums to its generated rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch
from omni_core.models import lockstep
from omni_core.platforms import platform_for
from omni_core.scheduler.ar_stage import ARStageWorker
from omni_core.scheduler.engine import EngineConfig, EngineRequest
from omni_core.scheduler.executor import Message
from omni_core.scheduler.hooks import ARHooks, StepBatch
from omni_core.scheduler.host_copy import to_device, to_host_later
from omni_core.scheduler.sampler import Sampler, SamplingTensors
from omni_core.scheduler.sampling_params import SamplingParams

from .code_predictor import CodePredictor
from .predictor_graphs import PredictorGraphs
from .speech import SpeechIds, assistant_codec_ids, assistant_text_ids, first_text_ready, trailing_id
from .talker import TalkerLM, TalkerProjections


@dataclass
class TalkerSampling:
    """The talker's and the code predictor's sampling (the reference's defaults); a temperature
    of 0 makes both greedy."""

    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    max_tokens: int = 4096
    predictor_top_k: int = 50
    predictor_top_p: float = 0.8


@dataclass
class Speaking:
    """One request's state, shared by the worker and the hooks (``extras["talker"]``)."""

    spoken: list[int]  # the assistant turn's thinker ids: opening, then the reply so far
    finished: bool  # the thinker's reply is complete
    prompt_len: int
    seed: int
    residual_sums: list[torch.Tensor] = field(default_factory=list)  # per generated frame


class TalkerHooks(ARHooks):
    def __init__(self, worker: TalkerWorker):
        self.w = worker

    def before_prefill(self, batch: StepBatch) -> None:
        """A recomputed request's generated rows get the sums their decode steps added."""
        offset = 0
        for extras, n in zip(batch.extras, batch.query_lens, strict=True):
            state: Speaking = extras["talker"]
            if state.residual_sums:
                start = int(batch.positions[offset])
                steps = [p - state.prompt_len for p in range(max(start, state.prompt_len), start + n)]
                if steps:
                    rows = slice(offset + steps[0] + state.prompt_len - start, offset + n)
                    batch.input_embeds = batch.input_embeds.clone()
                    batch.input_embeds[rows] += self._additions([state] * len(steps), steps).to(batch.input_embeds.dtype)
            offset += n

    def before_decode(self, batch: StepBatch) -> None:
        states: list[Speaking] = [extras["talker"] for extras in batch.extras]
        additions = self._additions(states, [n - 1 for n in batch.num_output_tokens])
        batch.input_embeds = batch.input_embeds + additions.to(batch.input_embeds.dtype)

    def _additions(self, states: list[Speaking], steps: list[int]) -> torch.Tensor:
        """What each decode step adds to its code's embedding: the frame's residual codes'
        embedding sum and the projected reply token it reads."""
        residual = torch.stack([s.residual_sums[k] for s, k in zip(states, steps, strict=True)])
        return residual + self.w.text_vectors([self.w.trailing(s, k) for s, k in zip(states, steps, strict=True)])

    def post_prefill(self, batch, hidden, logits, token_ids):
        self._predict(batch, hidden, token_ids)

    def post_decode(self, batch, hidden, logits, token_ids):
        self._predict(batch, hidden, token_ids)

    def _predict(self, batch: StepBatch, hidden: torch.Tensor, token_ids: torch.Tensor) -> None:
        states: list[Speaking] = [batch.extras[b]["talker"] for b in batch.sample_index]
        codes, sums = self.w.predict(hidden, token_ids, states, batch.num_output_tokens)
        for state, row in zip(states, sums, strict=True):
            state.residual_sums.append(row)
        # one copy for the batch, ready when the step's tokens are (queued before them)
        batch.step_outputs["codes"] = to_host_later(codes)


class TalkerWorker(ARStageWorker):
    """Input: the thinker's ``hidden`` stream. Output: ``codes`` ({"codes": [frames, groups]}),
    ending when the talker does."""

    def __init__(self, model: TalkerLM, projections: TalkerProjections, predictor: CodePredictor, thinker_embedding: torch.nn.Embedding,
                 speech: SpeechIds, engine_config: EngineConfig, sampling: TalkerSampling):
        super().__init__(model, engine_config=engine_config)
        self.hooks = TalkerHooks(self)
        self.projections = projections
        self.predictor = predictor
        self.thinker_embedding = thinker_embedding
        self.speech = speech
        self.sampling = sampling
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.sampler = Sampler()
        self.states: dict[str, Speaking] = {}
        model.suppress(speech.suppressed())
        # on CUDA the code predictor runs the core's fused kernels and replays a graph per batch size (predictor_graphs)
        self.fused_predictor = lockstep.fuses(self.device)
        graphs = platform_for(self.device).supports_graphs and engine_config.cuda_graphs
        self.predictor_graphs = PredictorGraphs(self._predict_rows) if graphs else None
        if self.predictor_graphs is not None:
            like = torch.zeros(1, model.hidden_size, device=self.device, dtype=self.dtype)
            self.predictor_graphs.capture(engine_config.max_num_seqs, sampling.temperature == 0, like)

    # -- the thinker's stream ------------------------------------------------------------------

    def make_request(self, message: Message) -> EngineRequest:
        p = message.payload
        plan, spoken, finished = p["plan"], [int(t) for t in p["spoken"]], bool(message.end)
        seed = p.get("seed")
        seed = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF if seed is None else int(seed) % (1 << 31)
        silent = not first_text_ready(spoken)
        if silent:  # a reply of one token: nothing to say; one step (max_tokens 1), whose frame is not voiced
            spoken = spoken + [self.speech.tts_eos] * 2
        embeds = self._prompt_embeds(plan, spoken, p.get("media_hidden"))
        state = Speaking(spoken, finished, embeds.shape[0], seed)
        self.states[message.request_id] = state
        s = self.sampling
        params = SamplingParams(
            temperature=s.temperature,
            top_k=s.top_k,
            top_p=s.top_p,
            repetition_penalty=s.repetition_penalty,
            max_tokens=1 if silent else min(s.max_tokens, (self.max_model_len or 1 << 30) - embeds.shape[0]),
            stop_token_ids=[self.speech.codec_eos],
            seed=seed,
        )
        positions = plan.get("rope_positions")
        return EngineRequest(message.request_id, prompt_embeds=embeds, params=params, extras={"talker": state},
                             rope_positions=None if positions is None else torch.as_tensor(positions))

    def on_input(self, message: Message) -> None:
        state = self.states[message.request_id]
        state.spoken.extend(int(t) for t in message.payload.get("token_ids", ()))
        state.finished = state.finished or message.end
        self._pause_or_resume(message.request_id, state)

    def _pause_or_resume(self, request_id: str, state: Speaking) -> None:
        seq = self.engine.requests.get(request_id)
        if seq is None or seq.num_output_tokens == 0:
            return  # still prefilling: the first decode's input is checked after its output
        if self.trailing(state, seq.num_output_tokens - 1) is None:
            self.engine.pause(request_id)
        else:
            self.engine.resume(request_id)

    # -- model pieces --------------------------------------------------------------------------

    @torch.inference_mode()
    def _prompt_embeds(self, plan: dict[str, Any], spoken: list[int], media_hidden) -> torch.Tensor:
        ids, media_rows = plan["user_ids"], plan["media_rows"]
        speech, p = self.speech, self.projections
        media = set(media_rows)
        text_rows = [j for j in range(len(ids)) if j not in media]
        user = torch.empty(len(ids), self.model.hidden_size, device=self.device, dtype=self.dtype)
        if text_rows:
            user[self._on_device(text_rows)] = self.text_vectors([ids[j] for j in text_rows])
        if media_rows:
            rows = to_device(torch.as_tensor(media_hidden), self.device).to(self.dtype)
            user[self._on_device(media_rows)] = p.hidden_projection(rows)
        assistant = self.text_vectors(assistant_text_ids(speech, spoken))
        codec = assistant_codec_ids(speech, plan["speaker"])
        with_codec = [i for i, c in enumerate(codec) if c is not None]
        codes = self._on_device([codec[i] for i in with_codec])
        assistant[self._on_device(with_codec)] += self.model.embed(codes)
        return torch.cat([user, assistant])

    def _on_device(self, values: list[int]) -> torch.Tensor:
        """Integers on the device through pinned memory, without waiting: a copy from pageable
        memory first waits for all the work queued on the GPU (the thinker's steps), which made a
        burst's talker prompts wait hundreds of milliseconds."""
        return to_device(torch.tensor(values, dtype=torch.int64), self.device)

    @torch.inference_mode()
    def text_vectors(self, thinker_ids: list[int]) -> torch.Tensor:
        """``text_projection`` of the thinker's embeddings of ``thinker_ids`` -> [n, H]."""
        ids = to_device(torch.tensor(thinker_ids, dtype=torch.int64), self.device)
        return self.projections.text_projection(self.thinker_embedding(ids))

    def trailing(self, state: Speaking, step: int) -> int | None:
        return trailing_id(self.speech, state.spoken, state.finished, step)

    @torch.inference_mode()
    def predict(self, hidden: torch.Tensor, code0: torch.Tensor, states: list[Speaking], done: list[int]):
        """The residual codes of each row's new frame [N, groups - 1] and their embedding sum [N, H]."""
        ids = to_device(torch.tensor([[st.seed for st in states], done], dtype=torch.int64), self.device)
        run = self.predictor_graphs or self._predict_rows
        return run(hidden, code0, ids[0], ids[1], self.sampling.temperature == 0)

    def _predict_rows(self, hidden: torch.Tensor, code0: torch.Tensor, seeds: torch.Tensor, frames: torch.Tensor, greedy: bool):
        """``predict`` from device tensors only (no host work: it runs inside a CUDA graph)."""
        if greedy:
            return self.predictor(hidden, self.model.embed(code0), fused=self.fused_predictor)
        s = self.sampling
        n = hidden.shape[0]
        groups = self.speech.num_code_groups
        f32 = dict(dtype=torch.float32, device=hidden.device)
        tensors = SamplingTensors(
            temperature=torch.ones(n, **f32), top_k=torch.full((n,), s.predictor_top_k, dtype=torch.int64, device=hidden.device),
            top_p=torch.full((n,), s.predictor_top_p, **f32), min_p=None, seeds=seeds, steps=None,
            all_greedy=False, any_top_k=s.predictor_top_k > 0, any_top_p=s.predictor_top_p < 1, any_min_p=False,
            max_top_k=s.predictor_top_k, all_top_k=s.predictor_top_k > 0,
        )

        def choose(logits: torch.Tensor, group: int) -> torch.Tensor:
            # a draw of its own per frame and codebook (the talker's draws use the frame index alone)
            tensors.steps = frames * groups + group + (1 << 20)
            return self.sampler(logits, tensors)

        return self.predictor(hidden, self.model.embed(code0), choose, fused=self.fused_predictor)

    # -- output --------------------------------------------------------------------------------

    def on_output(self, request_id, new_token_ids, finished, step_outputs, emit) -> bool:
        state = self.states[request_id]
        if finished:  # its frame (the codec's eos, or the length limit's) is not voiced
            emit("codes", {"codes": torch.zeros(0, self.speech.num_code_groups, dtype=torch.int64)}, end=True)
            self.states.pop(request_id, None)
            return False
        if new_token_ids:
            frame = torch.cat([torch.tensor(new_token_ids, dtype=torch.int64), step_outputs["codes"].to(torch.int64)])
            emit("codes", {"codes": frame[None]})
            self._pause_or_resume(request_id, state)
        return False

    def release(self, request_id: str) -> None:
        self.states.pop(request_id, None)
