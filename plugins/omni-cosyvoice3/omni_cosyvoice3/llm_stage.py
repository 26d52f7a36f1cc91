"""The ``llm`` stage on the core AR engine: prompt embeddings in, speech tokens streamed out.

RAS sampling and the minimum length run through the engine's hooks (``sample`` once per step for
the whole batch). Stop tokens (ids >= 6561) end a request and are not forwarded to the flow. Under
the minimum length only 6561 is blocked, as the reference's sampling does, so another stop id
(CosyVoice3's end token 6562 among them) still ends a request early, as it does there; with
``block_all_stops`` every stop id is (random-weight benchmarks use it to fix the lengths).
"""

from __future__ import annotations

import os
from typing import Any

import torch
from omni_core.scheduler.ar_stage import ARStageWorker
from omni_core.scheduler.engine import EngineConfig, EngineRequest
from omni_core.scheduler.executor import Message
from omni_core.scheduler.hooks import ARHooks, StepBatch
from omni_core.scheduler.host_copy import to_device
from omni_core.scheduler.sampler import uniform_noise
from omni_core.scheduler.sampling_params import SamplingParams

from .chunking import due_points
from .config import LLMConfig
from .frontend import InvalidInput
from .llm import EXTRA_TOKEN_ROWS, CosyVoice3LM
from .ras import RasParams, ras_sample

SAMPLING_KEYS = {"temperature", "top_p", "top_k", "repetition_penalty"}


class RasHooks(ARHooks):
    """Replaces the engine's sampler with batched repetition-aware sampling. It reads the recent
    tokens through ``batch.recent_tokens``, so the engine may overlap its decode steps."""

    samples_ahead = True

    def __init__(self, cfg: LLMConfig, block_all_stops: bool = False):
        self.cfg = cfg
        self.block_all_stops = block_all_stops
        self.blocked: torch.Tensor | None = None  # [V] bool: the ids a row under its minimum cannot draw
        self.held: dict[str, dict[str, Any]] = {}  # request id -> tokens not yet sent (SpeechTokenWorker)

    def _blocked(self, logits: torch.Tensor) -> torch.Tensor:
        if self.blocked is None or self.blocked.device != logits.device:
            ids = torch.arange(logits.shape[-1], device=logits.device)
            size = self.cfg.speech_token_size
            self.blocked = ids >= size if self.block_all_stops else ids == size
        return self.blocked

    def sample(self, batch: StepBatch, logits: torch.Tensor) -> torch.Tensor:
        rows = [batch.extras[b]["ras"] for b in batch.sample_index]
        done = batch.num_output_tokens
        win = self.cfg.win_size
        # the per-row numbers travel in one host tensor and one copy (no per-row transfers)
        data = [
            [r["top_p"], r["top_k"], r["temperature"], float(n < r["min_tokens"]), r["seed"], n]
            for r, n in zip(rows, done, strict=True)
        ]
        table = to_device(torch.tensor(data, dtype=torch.float64), logits.device)
        params = RasParams(
            top_p=table[:, 0].float(),
            top_k=table[:, 1].long(),
            temperature=table[:, 2].float(),
            k_max=max(r["top_k"] for r in rows),
            win_size=win,
            tau_r=self.cfg.tau_r,
        )
        uniforms = uniform_noise(table[:, 4].long(), table[:, 5].long(), 2).float()
        history = batch.recent_tokens(win, pad=-1)
        under_min = table[:, 3] > 0
        return ras_sample(logits, history, params, uniforms, under_min, self._blocked(logits))


def _sampling(values: Any, cfg: LLMConfig) -> dict[str, float]:
    values = dict(values or {})
    unknown = set(values) - SAMPLING_KEYS
    if unknown:
        raise InvalidInput(
            f"unknown sampling options {sorted(unknown)} for cosyvoice3; known: {sorted(SAMPLING_KEYS)}"
        )
    out = {"temperature": 1.0, "top_p": cfg.top_p, "top_k": cfg.top_k}
    penalty = values.pop("repetition_penalty", None)
    if penalty not in (None, 1, 1.0):
        raise InvalidInput("cosyvoice3 avoids repeats with RAS: repetition_penalty must be 1 or unset")
    out.update({k: v for k, v in values.items() if v is not None})
    if not 0 < float(out["temperature"]) <= 2:
        raise InvalidInput(f"temperature must be in (0, 2], got {out['temperature']}")
    if not 0 < float(out["top_p"]) <= 1:
        raise InvalidInput(f"top_p must be in (0, 1], got {out['top_p']}")
    if int(out["top_k"]) < 1:
        raise InvalidInput(f"top_k must be >= 1, got {out['top_k']}")
    return {
        "temperature": float(out["temperature"]),
        "top_p": float(out["top_p"]),
        "top_k": int(out["top_k"]),
    }


class SpeechTokenWorker(ARStageWorker):
    """Input payload (from the frontend): text_ids, target_text_len, llm_prompt_tokens, seed,
    sampling, and the flow's chunk schedule (flow_prompt_len, hop, max_hop, lookahead,
    streaming). Tokens are held back until the flow's next chunk is due (or the end), so the
    flow gets a few messages per request instead of one per token; silent and breath codes past
    five in a row are dropped, as the reference's llm job does (the chunk schedule counts what is
    kept)."""

    def __init__(self, model: CosyVoice3LM, engine_config: EngineConfig, block_all_stops: bool = False):
        self.ras_hooks = RasHooks(model.cfg, block_all_stops)
        super().__init__(model, hooks=self.ras_hooks, engine_config=engine_config)
        self.cfg = model.cfg
        self.stop_ids = list(range(self.cfg.speech_token_size, self.cfg.speech_token_size + EXTRA_TOKEN_ROWS))

    def make_request(self, message: Message) -> EngineRequest:
        p = message.payload
        model: CosyVoice3LM = self.model
        min_len, max_len = model.length_limits(int(p["target_text_len"]))
        seed = p.get("seed")
        if seed is None:
            seed = int.from_bytes(os.urandom(4), "little")
        ras = dict(_sampling(p.get("sampling"), self.cfg), seed=int(seed) & 0x7FFFFFFF, min_tokens=min_len)
        embeds = model.prompt_embeds(list(p["text_ids"]), list(p.get("llm_prompt_tokens") or []))
        points = (
            due_points(
                int(p.get("flow_prompt_len", 0)),
                int(p.get("hop", 25)),
                int(p.get("max_hop", 100)),
                int(p.get("lookahead", 3)),
            )
            if p.get("streaming", True)
            else iter(())
        )
        self.ras_hooks.held[message.request_id] = {
            "tokens": [],
            "count": 0,
            "silent_run": 0,
            "points": points,
            "next": next(points, None),
        }
        return EngineRequest(
            request_id=message.request_id,
            prompt_embeds=embeds,
            # the engine's minimum would keep a request going past any stop id, where the reference
            # stops on all but 6561, which the hook blocks (ras["min_tokens"])
            params=SamplingParams(max_tokens=max_len, min_tokens=min_len if self.ras_hooks.block_all_stops else 0,
                                  stop_token_ids=self.stop_ids, seed=ras["seed"]),
            extras={"ras": ras},
        )

    def on_output(self, request_id, new_token_ids, finished, step_outputs, emit) -> None:
        held = self.ras_hooks.held.get(request_id)
        speech = [t for t in new_token_ids if t < self.cfg.speech_token_size]
        if held is None:  # not scheduled by make_request: pass tokens straight on
            if speech or finished:
                emit("tokens", {"token_ids": speech}, end=finished)
            return
        speech = self._voiced(held, speech)
        held["tokens"].extend(speech)
        held["count"] += len(speech)
        due = held["next"] is not None and held["count"] >= held["next"]
        while held["next"] is not None and held["count"] >= held["next"]:
            held["next"] = next(held["points"], None)
        if due or finished:
            emit("tokens", {"token_ids": held["tokens"]}, end=finished)
            held["tokens"] = []
        if finished:
            self.ras_hooks.held.pop(request_id, None)

    def _voiced(self, held: dict[str, Any], speech: list[int]) -> list[int]:
        """``speech`` less the silent and breath codes past ``max_silent_run`` in a row (the run
        counted across steps, on the host, where the step's tokens already are)."""
        kept = []
        for token in speech:
            held["silent_run"] = held["silent_run"] + 1 if token in self.cfg.silent_tokens else 0
            if held["silent_run"] <= self.cfg.max_silent_run:
                kept.append(token)
        return kept

    def release(self, request_id: str) -> None:
        # aborted or failed: no last output will drop what is held
        self.ras_hooks.held.pop(request_id, None)
