"""Small tensor-computing stages wired in the four shapes the runtime must express.

Each stage does real (tiny) torch work with deterministic weights; ``reference_*`` functions
compute the same results without the runtime, so tests compare the two. Factories are
module-level functions (or partials of them) so stage processes can rebuild the topology.
"""

from __future__ import annotations

import functools
import os
import time

import torch
from omni_core.hooks import PluginManager
from omni_core.pipeline import JOINED_PORT, Edge, StageSpec, Topology

DIM = 16
VOCAB = 32


@functools.cache
def core_plugins() -> PluginManager:
    """omni-core's built-ins only: these tests need no family plugin."""
    return PluginManager(selection=set())


def weights(seed: int, *shape: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) / shape[-1] ** 0.5


def text_ids(text: str) -> torch.Tensor:
    return torch.tensor([ord(c) % VOCAB for c in text], dtype=torch.long)


def maybe_fail(stage: str, payload: dict, options: dict) -> None:
    text = payload.get("text")
    if isinstance(text, str) and options.get("fail_stage") == stage and "boom" in text:
        raise ValueError(f"cannot process {text!r}")
    if isinstance(text, str) and options.get("die_stage") == stage and "die" in text:
        os._exit(3)  # a crash that takes the whole stage process down


# ---- shared math (used by stages and by the references) --------------------------------------


def iter_ar_tokens(ids: torch.Tensor, steps: int, seed: int):
    """A toy autoregressive LM: next token = argmax(W @ (embed(prev) + running context))."""
    embed, head = weights(seed, VOCAB, DIM), weights(seed + 1, VOCAB, DIM)
    context = embed[ids].sum(0)
    token = int(ids[-1])
    for _ in range(steps):
        context = torch.tanh(context + embed[token])
        token = int(torch.argmax(head @ context))
        yield token


def ar_tokens(ids: torch.Tensor, steps: int, seed: int) -> list[int]:
    return list(iter_ar_tokens(ids, steps, seed))


def tokens_to_mel(tokens: torch.Tensor) -> torch.Tensor:
    """[T] tokens -> [8, 2T] mel-like frames (embedding, x2 upsample, conv)."""
    embed = weights(10, VOCAB, 8)
    conv = weights(11, 8, 8, 3)
    x = embed[tokens].T.repeat_interleave(2, dim=1)[None]
    return torch.nn.functional.conv1d(x, conv, padding=1)[0]


def mel_to_audio(mel: torch.Tensor) -> torch.Tensor:
    """[8, F] -> [F * 4] samples (linear per frame)."""
    proj = weights(12, 4, 8)
    return torch.tanh(proj @ mel).T.reshape(-1)


def codes_to_audio(codes: torch.Tensor) -> torch.Tensor:
    """[K, T] codes -> [T * 6] samples."""
    table = weights(20, codes.shape[0], VOCAB, 6)
    return torch.tanh(sum(table[k][codes[k]] for k in range(codes.shape[0]))).reshape(-1)


# ---- CosyVoice3-like: frontend -> llm =tokens=> flow =mel=> hift -> audio ----------------------


def cv_frontend(context):
    def run(message, emit):
        maybe_fail("frontend", message.payload, context.options)
        text = message.payload["text"]
        emit("out", {"ids": text_ids(text), "steps": int(message.payload.get("steps", 12)), "text": text})

    return run


def cv_llm(context):
    chunk = int(context.options.get("chunk", 4))
    delay = float(context.options.get("delay_s", 0.0))

    def run(message, emit):
        maybe_fail("llm", message.payload, context.options)
        tokens = ar_tokens(message.payload["ids"], message.payload["steps"], seed=1)
        for start in range(0, len(tokens), chunk):
            if delay:
                time.sleep(delay)
            chunk_tokens = torch.tensor(tokens[start : start + chunk])
            emit("tokens", {"tokens": chunk_tokens, "text": message.payload["text"]}, end=False)
        emit("tokens", {}, end=True)

    return run


class FlowWorker:
    """Batched and stateful: keeps each request's tokens and emits only the new mel frames."""

    def __init__(self, context):
        self.options = context.options
        self.seen: dict[str, torch.Tensor] = {}

    def process(self, messages, emit):
        for message in messages:
            maybe_fail("flow", message.payload, self.options)
            new = message.payload.get("tokens")
            if new is not None and len(new):
                emit(message.request_id, "mel", {"mel": tokens_to_mel(new)}, end=False)
            if message.end:
                emit(message.request_id, "mel", {}, end=True)

    def release(self, request_id):
        self.seen.pop(request_id, None)


class HiftWorker:
    def __init__(self, context):
        self.options = context.options
        self.calls: list[int] = []

    def process(self, messages, emit):
        self.calls.append(len(messages))
        for message in messages:
            mel = message.payload.get("mel")
            if mel is not None:
                emit(message.request_id, "audio", {"audio": mel_to_audio(mel)}, end=False)
            if message.end:
                emit(message.request_id, "audio", {"samples_done": True}, end=True)


def cosyvoice_like(**options) -> Topology:
    def stage(name, engine, factory, inputs=("in",), outputs=("out",)):
        return StageSpec(name, engine, factory, inputs, outputs, options=dict(options))

    return Topology(
        name="cosyvoice-like",
        stages=[
            stage("frontend", "fn", cv_frontend),
            stage("llm", "fn", cv_llm, outputs=("tokens",)),
            stage("flow", "batch", FlowWorker, inputs=("tokens",), outputs=("mel",)),
            stage("hift", "batch", HiftWorker, inputs=("mel",), outputs=("audio",)),
        ],
        edges=[
            Edge("frontend.out", "llm.in"),
            Edge("llm.tokens", "flow.tokens", "stream"),
            Edge("flow.mel", "hift.mel", "stream"),
        ],
        entry="frontend.in",
        outputs={"audio": "hift.audio"},
    )


def reference_cosyvoice(text: str, steps: int = 12, chunk: int = 4) -> torch.Tensor:
    tokens = ar_tokens(text_ids(text), steps, seed=1)
    chunks = [torch.tensor(tokens[i : i + chunk]) for i in range(0, len(tokens), chunk)]
    return torch.cat([mel_to_audio(tokens_to_mel(c)) for c in chunks])


# ---- Qwen3-Omni-like: fan-out/fan-in, text + audio out, talker <-> code predictor -------------


def has(key):
    return functools.partial(_has, key)


def _has(key, inputs):
    return inputs.get(key) is not None


def omni_preprocess(context):
    def run(message, emit):
        payload = message.payload
        maybe_fail("preprocess", payload, context.options)
        emit("text", {"ids": text_ids(payload["text"])})
        if payload.get("audio") is not None:
            emit("audio", {"audio": payload["audio"]})
        if payload.get("image") is not None:
            emit("image", {"image": payload["image"]})

    return run


def encode_audio(audio: torch.Tensor) -> torch.Tensor:
    frames = audio[: len(audio) // 8 * 8].reshape(-1, 8)
    return torch.tanh(frames @ weights(30, 8, DIM))


def encode_image(image: torch.Tensor) -> torch.Tensor:
    pooled = torch.nn.functional.avg_pool2d(image[None, None], 4)[0, 0]
    return torch.tanh(pooled.reshape(-1, 4) @ weights(31, 4, DIM))


class EncoderWorker:
    def __init__(self, context, kind):
        self.kind = kind
        self.batch_sizes: list[int] = []

    def process(self, messages, emit):
        self.batch_sizes.append(len(messages))
        for message in messages:
            data = message.payload[self.kind]
            embeds = encode_audio(data) if self.kind == "audio" else encode_image(data)
            emit(message.request_id, "out", {"embeds": embeds})


def omni_aggregate(context):
    def run(message, emit):
        assert message.port == JOINED_PORT, message.port
        joined = message.payload
        parts = [weights(32, VOCAB, DIM)[joined["text"]["ids"]]]
        for key in ("audio", "image"):
            if key in joined:
                parts.append(joined[key]["embeds"])
        emit("out", {"embeds": torch.cat(parts), "parts": sorted(joined)})

    return run


def thinker_step_outputs(embeds: torch.Tensor, steps: int):
    head = weights(33, VOCAB, DIM)
    state = embeds.mean(0)
    for _ in range(steps):
        state = torch.tanh(state + head.T @ torch.softmax(head @ state, 0))
        yield int(torch.argmax(head @ state)), state.clone()


def omni_thinker(context):
    def run(message, emit):
        maybe_fail("thinker", message.payload, context.options)
        text = []
        for token, hidden in thinker_step_outputs(
            message.payload["embeds"], int(context.options.get("steps", 5))
        ):
            text.append(chr(97 + token % 26))
            emit("text", {"text": text[-1]}, end=False)
            emit("hidden", {"hidden": hidden}, end=False)
        emit("text", {"text": "".join(text), "parts": message.payload["parts"]}, end=True)
        emit("hidden", {}, end=True)

    return run


def talker_code0(hidden: torch.Tensor) -> int:
    return int(torch.argmax(weights(34, VOCAB, DIM) @ hidden))


def predict_residual_codes(hidden: torch.Tensor, code0: int) -> list[int]:
    heads = weights(35, 3, VOCAB, DIM)
    x = torch.tanh(hidden + weights(36, VOCAB, DIM)[code0])
    return [int(torch.argmax(heads[k] @ x)) for k in range(3)]


class TalkerWorker:
    """Per step: code 0 from its state, then waits for the code predictor's residual codes
    (feedback edge) before the next step; its next input mixes the frame's codes back in."""

    def __init__(self, context):
        self.state: dict[str, dict] = {}

    def __call__(self, message, emit):
        st = self.state.setdefault(
            message.request_id, {"pending": [], "waiting": False, "ended": False, "carry": torch.zeros(DIM)}
        )
        if message.port == "hidden":
            if message.payload.get("hidden") is not None:
                st["pending"].append(message.payload["hidden"])
            st["ended"] = st["ended"] or message.end
        else:  # residual codes of the step in flight
            frame = [st["code0"], *message.payload["codes"]]
            st["carry"] = weights(37, VOCAB, DIM)[torch.tensor(frame)].sum(0)
            emit("codes", {"codes": torch.tensor(frame)[:, None]}, end=False)
            st["waiting"] = False
        if st["waiting"]:
            return
        if st["pending"]:
            hidden = torch.tanh(st["pending"].pop(0) + st["carry"])
            st["code0"] = talker_code0(hidden)
            st["waiting"] = True
            emit("step", {"hidden": hidden, "code0": st["code0"]}, end=False)
        elif st["ended"]:
            emit("codes", {}, end=True)

    def release(self, request_id):
        self.state.pop(request_id, None)


def omni_code_predictor(context):
    def run(message, emit):
        emit(
            "codes",
            {"codes": predict_residual_codes(message.payload["hidden"], message.payload["code0"])},
            end=False,
        )

    return run


class Code2WavWorker:
    def __init__(self, context):
        pass

    def process(self, messages, emit):
        for message in messages:
            codes = message.payload.get("codes")
            if codes is not None:
                emit(message.request_id, "audio", {"audio": codes_to_audio(codes)}, end=False)
            if message.end:
                emit(message.request_id, "audio", {}, end=True)


def omni_like(**options) -> Topology:
    def stage(name, engine, factory, inputs=("in",), outputs=("out",)):
        return StageSpec(name, engine, factory, inputs, outputs, options=dict(options))

    return Topology(
        name="omni-like",
        stages=[
            stage("preprocess", "fn", omni_preprocess, outputs=("text", "audio", "image")),
            stage("audio_encoder", "batch", functools.partial(EncoderWorker, kind="audio")),
            stage("image_encoder", "batch", functools.partial(EncoderWorker, kind="image")),
            stage("aggregate", "fn", omni_aggregate, inputs=("text", "audio", "image")),
            stage("thinker", "fn", omni_thinker, outputs=("text", "hidden")),
            stage("talker", "fn", TalkerWorker, inputs=("hidden", "codes"), outputs=("step", "codes")),
            stage("code_predictor", "fn", omni_code_predictor, outputs=("codes",)),
            stage("code2wav", "batch", Code2WavWorker, inputs=("codes",), outputs=("audio",)),
        ],
        edges=[
            Edge("preprocess.text", "aggregate.text"),
            Edge("preprocess.audio", "audio_encoder.in", when=has("audio")),
            Edge("preprocess.image", "image_encoder.in", when=has("image")),
            Edge("audio_encoder.out", "aggregate.audio"),
            Edge("image_encoder.out", "aggregate.image"),
            Edge("aggregate.out", "thinker.in"),
            Edge("thinker.hidden", "talker.hidden", "stream", when=functools.partial(_wants_audio)),
            Edge("talker.step", "code_predictor.in", "feedback"),
            Edge("code_predictor.codes", "talker.codes", "feedback"),
            Edge("talker.codes", "code2wav.codes", "stream"),
        ],
        entry="preprocess.in",
        outputs={"text": "thinker.text", "audio": "code2wav.audio"},
    )


def _wants_audio(inputs):
    return "audio" in inputs.get("modalities", ["text"])


def reference_omni(text, audio=None, image=None, steps=5):
    parts = [weights(32, VOCAB, DIM)[text_ids(text)]]
    if audio is not None:
        parts.append(encode_audio(audio))
    if image is not None:
        parts.append(encode_image(image))
    embeds = torch.cat(parts)
    text_out, frames, carry = [], [], torch.zeros(DIM)
    for token, hidden in thinker_step_outputs(embeds, steps):
        text_out.append(chr(97 + token % 26))
        h = torch.tanh(hidden + carry)
        code0 = talker_code0(h)
        frame = [code0, *predict_residual_codes(h, code0)]
        carry = weights(37, VOCAB, DIM)[torch.tensor(frame)].sum(0)
        frames.append(codes_to_audio(torch.tensor(frame)[:, None]))
    return "".join(text_out), torch.cat(frames)


# ---- Fish-like: frontend(+reference encode) -> dual AR =codes=> codec -> audio ------------------


def fish_frontend(context):
    def run(message, emit):
        payload = message.payload
        maybe_fail("frontend", payload, context.options)
        prompt = text_ids(payload["text"])
        if payload.get("reference_audio") is not None:
            ref = payload["reference_audio"]
            codes = torch.argmax(ref[: len(ref) // 6 * 6].reshape(-1, 6) @ weights(40, 6, VOCAB), -1)
            prompt = torch.cat([codes, prompt])
        emit(
            "out",
            {"prompt": prompt, "frames": int(payload.get("frames", 6)), "delay_s": payload.get("delay_s", 0)},
        )

    return run


def dual_ar_frames(prompt: torch.Tensor, frames: int):
    """Slow AR picks code 0 per frame; a fast AR fills the frame's other codes."""
    for code0 in iter_ar_tokens(prompt, frames, seed=41):
        yield [code0, *ar_tokens(torch.tensor([code0]), 2, seed=43)]


def fish_dual_ar(context):
    def run(message, emit):
        maybe_fail("dual_ar", message.payload, context.options)
        for frame in dual_ar_frames(message.payload["prompt"], message.payload["frames"]):
            if message.payload["delay_s"]:
                time.sleep(message.payload["delay_s"])
            emit("codes", {"codes": torch.tensor(frame)[:, None]}, end=False)
        emit("codes", {}, end=True)

    return run


def fish_like(**options) -> Topology:
    return Topology(
        name="fish-like",
        stages=[
            StageSpec("frontend", "fn", fish_frontend, options=dict(options)),
            StageSpec("dual_ar", "fn", fish_dual_ar, outputs=("codes",), options=dict(options)),
            StageSpec(
                "codec", "batch", Code2WavWorker, inputs=("codes",), outputs=("audio",), options=dict(options)
            ),
        ],
        edges=[Edge("frontend.out", "dual_ar.in"), Edge("dual_ar.codes", "codec.codes", "stream")],
        entry="frontend.in",
        outputs={"audio": "codec.audio"},
    )


def reference_fish(text, reference_audio=None, frames=6):
    prompt = text_ids(text)
    if reference_audio is not None:
        ref = reference_audio
        codes = torch.argmax(ref[: len(ref) // 6 * 6].reshape(-1, 6) @ weights(40, 6, VOCAB), -1)
        prompt = torch.cat([codes, prompt])
    return torch.cat([codes_to_audio(torch.tensor(f)[:, None]) for f in dual_ar_frames(prompt, frames)])


# ---- ASR-like: frontend(mel) -> encoder -> decoder -> text deltas ----------------------------


def log_mel(audio: torch.Tensor) -> torch.Tensor:
    spec = torch.stft(audio, n_fft=64, hop_length=16, window=torch.hann_window(64), return_complex=True)
    return torch.log1p(spec.abs() ** 2)  # [33, frames]


def asr_frontend(context):
    def run(message, emit):
        maybe_fail("frontend", message.payload, context.options)
        emit("out", {"mel": log_mel(message.payload["audio"])})

    return run


class AsrEncoder:
    def __init__(self, context):
        self.batch_sizes: list[int] = []

    def process(self, messages, emit):
        self.batch_sizes.append(len(messages))
        mels = [m.payload["mel"] for m in messages]
        width = max(m.shape[1] for m in mels)
        batch = torch.stack([torch.nn.functional.pad(m, (0, width - m.shape[1])) for m in mels])
        encoded = torch.tanh(torch.einsum("bft,fd->btd", batch, weights(50, 33, DIM)))
        for message, mel, states in zip(messages, mels, encoded, strict=False):
            emit(message.request_id, "out", {"states": states[: mel.shape[1]].clone()})


def asr_decode(states: torch.Tensor, max_tokens: int = 8) -> list[str]:
    ids = torch.argmax(states @ weights(51, DIM, VOCAB), -1)
    return [chr(97 + t % 26) for t in ar_tokens(ids, max_tokens, seed=52)]


def asr_decoder(context):
    if context.options.get("broken_stage") == "decoder":
        raise RuntimeError("decoder weights missing")

    def run(message, emit):
        pieces = asr_decode(message.payload["states"])
        for piece in pieces:
            emit("text", {"text": piece}, end=False)
        emit("text", {"text": "".join(pieces)}, end=True)

    return run


def asr_like(**options) -> Topology:
    return Topology(
        name="asr-like",
        stages=[
            StageSpec("frontend", "fn", asr_frontend, options=dict(options)),
            StageSpec("encoder", "batch", AsrEncoder, options={"batch_window_ms": 20, **options}),
            StageSpec("decoder", "fn", asr_decoder, outputs=("text",), options=dict(options)),
        ],
        edges=[Edge("frontend.out", "encoder.in"), Edge("encoder.out", "decoder.in")],
        entry="frontend.in",
        outputs={"text": "decoder.text"},
    )


def reference_asr(audio: torch.Tensor) -> str:
    states = torch.tanh(log_mel(audio).T @ weights(50, 33, DIM))
    return "".join(asr_decode(states))


BUILDERS = {"cosyvoice": cosyvoice_like, "omni": omni_like, "fish": fish_like, "asr": asr_like}


def build(shape: str, **options) -> Topology:
    """``rebuild`` target for stage processes: ``functools.partial(build, shape, **options)``."""
    return BUILDERS[shape](**options)
