"""The stage workers: preprocess (fn), audio_encoder and vision_encoder (batch), thinker (ar)."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import Any

import torch
from omni_core.hooks import InvalidInput
from omni_core.models.mel import log_mel
from omni_core.scheduler.ar_stage import ARStageWorker
from omni_core.scheduler.engine import EngineConfig, EngineRequest
from omni_core.scheduler.executor import Message
from omni_core.scheduler.sampling_params import SamplingParams

from .audio_encoder import AudioEncoder, audio_rows
from .config import OmniCheckpoint, load_tokenizer
from .media import MediaError, Patches, decode_video, fitted_size, frames_patches, image_patches
from .prompt import MediaItem, expand, media_index, render
from .speech import SpeechIds, first_text_ready, talker_plan
from .text import TextStream
from .thinker import PromptMedia, ThinkerLM
from .vision_encoder import VisionEncoder


class Preprocessor:
    """Chat payload -> the thinker's prompt (template, placeholders, positions), the audio clips
    for the audio encoder and the patches for the vision encoder. Options: ``max_audios``,
    ``max_images``, ``max_videos`` (parts a request may hold), ``video_fps``,
    ``video_max_frames``, ``video_min_pixels``, ``video_max_pixels``, ``max_model_len``."""

    def __init__(self, ckpt: OmniCheckpoint, limits: dict[str, Any], speaks: bool = False):
        self.ckpt = ckpt
        self.tokenizer = load_tokenizer(ckpt.path)
        self.limits = limits
        self.speech = SpeechIds.of(ckpt) if speaks else None

    def __call__(self, message: Message, emit) -> None:
        payload = message.payload
        if payload.get("task") == "speech":
            payload = self._speech_as_chat(payload)
        elif payload.get("task") != "chat":
            raise InvalidInput(f"qwen3-omni serves chat and speech, not {payload.get('task')!r}")
        speaker = self._speaker(payload) if "audio" in (payload.get("modalities") or ()) else None
        media, clips, visual, digest = self._media(payload["messages"])
        try:
            prompt = expand(self.ckpt, render(self.ckpt, self.tokenizer, payload["messages"]), media)
            plan = None if speaker is None else talker_plan(self.ckpt, self.speech, prompt.token_ids, media, speaker)
        except ValueError as exc:
            raise InvalidInput(f"messages: {exc}") from None
        limit = self.limits["max_model_len"]
        if len(prompt.token_ids) >= limit:
            raise InvalidInput(f"messages: the prompt takes {len(prompt.token_ids)} tokens; the model takes at most {limit - 1}")
        sampling = dict(payload.get("sampling") or {})
        emit(
            "prompt",
            {
                "token_ids": prompt.token_ids,
                "rope_positions": prompt.rope_positions,
                "media": [item.kind for item in media],
                "media_key": digest.hexdigest() if media else None,
                "sampling": sampling,
                "talker": plan,
            },
        )
        if clips:
            emit("audio", {"clips": clips})
        if visual:
            emit("vision", {"patches": torch.cat([p.pixels for p in visual]), "grids": [list(p.grid) for p in visual]})

    def _speaker(self, payload: dict) -> int:
        """The codec id of the voice a request asks for (the checkpoint's default without one)."""
        if self.speech is None:
            raise InvalidInput(
                "this server was started without speech output (--option audio_output=false): ask for modalities [\"text\"]",
                "modalities",
            )
        if payload.get("reference_audio") is not None:
            raise InvalidInput(f"qwen3-omni speaks in its built-in voices only: {', '.join(self.speech.speakers)}", "voice")
        voice = (payload.get("voice") or self.speech.default_speaker).lower()
        if voice not in self.speech.speakers:
            raise InvalidInput(f"unknown voice {voice!r}; available: {', '.join(self.speech.speakers)}", "voice")
        return self.speech.speakers[voice]

    @staticmethod
    def _speech_as_chat(payload: dict) -> dict:
        """/v1/audio/speech as a chat: the thinker is asked to say the text back, word for word."""
        if float(payload.get("speed", 1.0)) != 1.0:
            raise InvalidInput("qwen3-omni speaks at its own pace: speed must be 1", "speed")
        messages = []
        if payload.get("instructions"):
            messages.append({"role": "system", "content": [{"type": "text", "text": payload["instructions"]}]})
        request = f"Say the following text aloud, exactly as written, and nothing else:\n\n{payload['text']}"
        messages.append({"role": "user", "content": [{"type": "text", "text": request}]})
        sampling = dict(payload.get("sampling") or {})
        if payload.get("seed") is not None:
            sampling["seed"] = payload["seed"]
        return {**payload, "task": "chat", "messages": messages, "modalities": ["text", "audio"], "sampling": sampling}

    def _media(self, messages: list[dict]):
        """Every media part in prompt order: its prompt item, the audio clips, the visual patches
        and a digest of all of it (the prefix cache's key)."""
        media: list[MediaItem] = []
        clips, visual = [], []
        digest = hashlib.sha256()
        counts = {"audio": 0, "image": 0, "video": 0}
        for i, message in enumerate(messages):
            for j, part in enumerate(message["content"]):
                kind, where = part["type"], f"messages[{i}].content[{j}]"
                if kind == "text":
                    continue
                if kind not in counts:
                    raise InvalidInput(f"{where}: qwen3-omni takes text, audio, image and video parts, not {kind!r}", where)
                counts[kind] += 1
                most = self.limits[f"max_{kind}s"]
                if counts[kind] > most:
                    raise InvalidInput(f"{where}: at most {most} {kind} part(s) a request", where)
                try:
                    item, content = self._audio(part) if kind == "audio" else self._visual(kind, part)
                except MediaError as exc:
                    raise InvalidInput(f"{where}: {exc}", where) from None
                media.append(item)
                (clips if kind == "audio" else visual).append(content)
                # each part's kind, shape and timing, then its content: no two different prompts digest alike
                pixels = content if kind == "audio" else content.pixels
                digest.update(repr((kind, item.rows, item.grid, item.seconds_per_grid)).encode() + pixels.numpy().tobytes())
        return media, clips, visual, digest

    def _audio(self, part: dict) -> tuple[MediaItem, torch.Tensor]:
        settings = self.ckpt.audio
        samples = torch.as_tensor(part["audio"], dtype=torch.float32).reshape(-1)
        if samples.numel() < settings.n_fft or not bool(torch.isfinite(samples).all()):
            milliseconds = settings.n_fft / settings.sampling_rate * 1000
            raise MediaError(f"the audio is shorter than {settings.n_fft} samples ({milliseconds:.0f} ms) or not finite")
        if samples.numel() > settings.max_samples:
            raise MediaError(f"the audio lasts more than {settings.max_samples / settings.sampling_rate:.0f} s")
        return MediaItem("audio", audio_rows(samples.numel(), settings.hop_length, self.ckpt.audio_config.n_window)), samples

    def _visual(self, kind: str, part: dict) -> tuple[MediaItem, Patches]:
        vision = self.ckpt.vision
        if kind == "image":
            patches, seconds = image_patches(part["image"], vision), 0.0
        else:
            bounds = self.limits["video_min_pixels"], self.limits["video_max_pixels"]
            frames, interval = decode_video(part["video"], self.limits["video_fps"], self.limits["video_max_frames"],
                                            lambda w, h: fitted_size(w, h, vision, *bounds))
            patches, seconds = frames_patches(frames, vision, *bounds), interval * vision.temporal_patch_size
        t, h, w = patches.grid
        return MediaItem(kind, t * h * w // vision.merge_size**2, patches.grid, seconds), patches


class AudioEncoderWorker:
    """Every clip of every request in the batch through one encoder call (features on the
    encoder's device)."""

    def __init__(self, model: AudioEncoder, ckpt: OmniCheckpoint):
        self.model = model
        self.settings = ckpt.audio
        self.device = next(model.parameters()).device

    def process(self, messages: list[Message], emit) -> None:
        s = self.settings
        features = [
            log_mel(clip.to(self.device), s.n_mels, s.n_fft, s.hop_length, s.sampling_rate)
            for message in messages
            for clip in message.payload["clips"]
        ]
        embeds = iter(self.model(features))
        for message in messages:
            emit(message.request_id, "out", {"embeds": [next(embeds) for _ in message.payload["clips"]]})


class VisionEncoderWorker:
    """Every image and video of every request in the batch through one encoder call."""

    def __init__(self, model: VisionEncoder, ckpt: OmniCheckpoint):
        self.model = model
        self.merge = ckpt.vision.merge_size

    def process(self, messages: list[Message], emit) -> None:
        patches = torch.cat([m.payload["patches"] for m in messages])
        grids = [tuple(g) for m in messages for g in m.payload["grids"]]
        tokens, deep = self.model(patches, grids)
        start = 0
        for message in messages:
            sizes = [t * h * w // self.merge**2 for t, h, w in message.payload["grids"]]
            rows = sum(sizes)
            # one embedding block per image or video; the deepstack rows stay whole (they follow the visual placeholders)
            emit(message.request_id, "out", {"embeds": list(tokens[start : start + rows].split(sizes)), "deepstack": deep[:, start : start + rows]})
            start += rows


@dataclass
class Voicing:
    """A thinker request whose reply the talker voices: what it has sent on ``hidden``."""

    plan: dict[str, Any]
    spoken: list[int]  # the assistant turn's ids: opening, then the reply so far
    seed: int | None
    sent: bool = False
    rows_seen: int = 0  # prompt rows whose states have come
    media_states: list[torch.Tensor] = field(default_factory=list)


SAMPLING_KEYS = {"temperature", "top_p", "top_k", "repetition_penalty", "max_tokens", "seed", "stop"}


class ThinkerWorker(ARStageWorker):
    """The thinker on the core engine: prompt ids with the encoders' rows at the placeholders,
    multimodal rotary positions; text deltas out on ``text``, the last message with the whole
    text, usage and finish reason. Requests with media are prefix-cached under their media's
    digest (equal media and equal ids share blocks); text-only ones as usual."""

    def __init__(self, model: ThinkerLM, ckpt: OmniCheckpoint, engine_config: EngineConfig, defaults: dict[str, Any], speaks: bool = False):
        super().__init__(model, engine_config=engine_config)
        self.ckpt = ckpt
        self.tokenizer = load_tokenizer(ckpt.path)
        self.defaults = defaults
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.max_position = int(ckpt.text_config.max_position_embeddings)
        self.streams: dict[str, tuple[TextStream, int]] = {}
        self.voicing: dict[str, Voicing] = {}
        self.accept_layer = SpeechIds.of(ckpt).accept_hidden_layer if speaks else None

    def make_request(self, message: Message) -> EngineRequest:
        parts = message.payload
        prompt = parts["prompt"]
        ids = prompt["token_ids"]
        positions = prompt.get("rope_positions")
        delta = 0 if positions is None else int(positions.max()) + 1 - len(ids)
        params, stop = self._sampling(prompt.get("sampling") or {}, len(ids), delta)
        extras: dict[str, Any] = {}
        key = None
        if prompt["media"]:
            extras["media"] = self._media(prompt["media"], parts, ids)
            key = prompt["media_key"]
        self.streams[message.request_id] = (TextStream(self.tokenizer, stop), len(ids))
        plan = prompt.get("talker")
        prompt_layers: tuple[int, ...] = ()
        if plan is not None:
            self.voicing[message.request_id] = Voicing(plan, list(plan["assistant_ids"]), params.seed)
            if plan["media_positions"]:
                # the talker reads the thinker's states at the user turns' media rows: every prompt
                # position is computed, so the request is not prefix-cached
                prompt_layers, key = (self.accept_layer,), None
        return EngineRequest(
            request_id=message.request_id,
            prompt_token_ids=ids,
            params=params,
            extras=extras,
            prefix_key=key,
            rope_positions=positions,
            prompt_hidden_layers=prompt_layers,
        )

    def _media(self, kinds: list[str], parts: dict, ids: list[int]) -> PromptMedia:
        audio = iter(parts["audio"]["embeds"]) if "audio" in parts else iter(())
        vision = parts.get("vision")
        visual = iter(vision["embeds"]) if vision else iter(())
        rows = [next(audio) if kind == "audio" else next(visual) for kind in kinds]
        index, deep_index = media_index(ids, self.ckpt)
        deep = vision["deepstack"] if vision else None
        return PromptMedia(torch.cat(rows), index, deep, deep_index if deep is not None else None).to(self.device, self.dtype)

    def _sampling(self, values: dict[str, Any], prompt_len: int, delta: int = 0) -> tuple[SamplingParams, list[str]]:
        """SamplingParams and stop strings; ``delta``: how far generated tokens' rotary positions run
        past their index (a long video's positions can), which the model's position table bounds."""
        unknown = set(values) - SAMPLING_KEYS
        if unknown:
            raise InvalidInput(f"unknown sampling options {sorted(unknown)}; known: {sorted(SAMPLING_KEYS)}")
        merged = {**self.defaults, **{k: v for k, v in values.items() if v is not None}}
        stop = merged.pop("stop", None) or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        room = min((self.max_model_len or 1 << 30) - prompt_len, self.max_position - prompt_len - delta)
        if room < 1:
            raise InvalidInput(f"messages: the prompt takes {prompt_len} tokens; the model takes at most {self.max_model_len - 1}")
        merged.setdefault("max_tokens", room)
        if merged["max_tokens"] > room:
            raise InvalidInput(
                f"max_tokens: the prompt takes {prompt_len} tokens and the model {self.max_model_len}: at most {room} more"
            )
        seed = merged.get("seed")
        merged["seed"] = int.from_bytes(os.urandom(4), "little") & 0x7FFFFFFF if seed is None else int(seed) % (1 << 63)
        return SamplingParams(stop_token_ids=list(self.ckpt.tokens.eos), **merged), stop

    def on_output(self, request_id, new_token_ids, finished, step_outputs, emit) -> bool:
        stream, prompt_len = self.streams[request_id]
        delta = stream.push(new_token_ids)
        done = finished or stream.stopped
        voicing = self.voicing.get(request_id)
        if voicing is not None:
            self._voice(voicing, new_token_ids, step_outputs, done, emit)
            if done:
                self.voicing.pop(request_id, None)
        if delta and not done:
            emit("text", {"text": delta})
        if not done:
            return False
        delta += stream.finish()
        if delta:
            emit("text", {"text": delta})
        self.streams.pop(request_id, None)
        completion = len(stream.tokens)
        reason = "length" if finished and not stream.stopped and not self._ended_by_eos(stream) else "stop"
        emit(
            "text",
            {
                "text": stream.text,
                "finish_reason": reason,
                "usage": {"prompt_tokens": prompt_len, "completion_tokens": completion, "total_tokens": prompt_len + completion},
            },
            end=True,
        )
        return not finished

    def _ended_by_eos(self, stream: TextStream) -> bool:
        return bool(stream.tokens) and stream.tokens[-1] in self.ckpt.tokens.eos

    def _voice(self, voicing: Voicing, new_token_ids: list[int], step_outputs: dict, done: bool, emit) -> None:
        """The talker's stream (``hidden``): its plan, the media rows' states and the assistant
        ids so far once the reply's first token is usable, then each new reply id."""
        plan = voicing.plan
        states = (step_outputs.get("hidden_states") or {}).get(self.accept_layer)
        if states is not None and not voicing.sent:
            # prompt rows arrive in order, a prefill chunk at a time (again if recomputed: kept once)
            start, end = voicing.rows_seen, voicing.rows_seen + states.shape[0]
            for j, position in enumerate(plan["media_positions"]):
                if start <= position < end and j == len(voicing.media_states):
                    voicing.media_states.append(states[position - start].clone())  # not a view pinning the chunk
            voicing.rows_seen = end
        voicing.spoken.extend(new_token_ids)
        if not voicing.sent:
            if not (first_text_ready(voicing.spoken) or done):
                return
            media = torch.stack(voicing.media_states).float().cpu() if voicing.media_states else None
            # a copy: in one process the message is not serialized, and this list keeps growing
            emit("hidden", {"plan": plan, "spoken": list(voicing.spoken), "media_hidden": media, "seed": voicing.seed}, end=done)
            voicing.sent = True
        elif new_token_ids or done:
            emit("hidden", {"token_ids": list(new_token_ids)}, end=done)

    def release(self, request_id: str) -> None:
        self.voicing.pop(request_id, None)
        self.streams.pop(request_id, None)
