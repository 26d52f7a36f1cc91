"""A multilingual checkpoint (the ``tiny-multilingual`` preset: Whisper's multilingual token
layout, random weights): language detection and translation against transformers' Whisper on the
same weights, then both through a real server and the `openai` client."""

from __future__ import annotations

import io

import numpy as np
import openai
import pytest
import soundfile as sf
import torch
from omni_whisper.decode_batch import DecodeBatch
from omni_whisper.features import log_mel, split_windows
from omni_whisper.presets import write_tiny_multilingual
from omni_whisper.stages import DecoderWorker
from transformers import WhisperForConditionalGeneration
from transformers.models.whisper.tokenization_whisper import LANGUAGES

from tests.helpers.server import OmniServer


@pytest.fixture(scope="module")
def preset_dir(tmp_path_factory) -> str:
    return write_tiny_multilingual(str(tmp_path_factory.mktemp("whisper-multilingual") / "tiny-multilingual"))


@pytest.fixture(scope="module")
def clips(spoken_16k) -> list[np.ndarray]:
    noise = (0.1 * np.random.default_rng(3).standard_normal(16000 * 3)).astype(np.float32)
    return [spoken_16k[0], spoken_16k[4], noise]


def _payload(worker: DecoderWorker, audio: np.ndarray, task: str, language: str | None = None) -> dict:
    mel = log_mel(split_windows(torch.from_numpy(audio))[0])
    with torch.inference_mode():
        encoded = worker.model.encoder(mel)
    return {"encoded": encoded, "durations": [len(audio) / 16000], "offsets": [0.0], "prompt": None, "task": task, "language": language,
            "temperature": 0.0, "timestamps": False, "duration": len(audio) / 16000, "mel": mel}


def _decode(worker: DecoderWorker, payload: dict) -> tuple[str, list[int]]:
    request = worker.new_request("r", payload, live=True)
    batch = DecodeBatch(worker.model, worker.rules, capacity=1, source_positions=worker.source_positions)
    batch.admit(request.windows[0], request.encoded[0])
    while len(batch):
        batch.remove(batch.step())
    return request.language, request.windows[0].prompt + request.windows[0].tokens


@pytest.mark.parametrize("task", ["transcribe", "translate"])
def test_detected_language_and_tokens_equal_transformers(preset_dir, clips, task):
    worker = DecoderWorker(preset_dir, "float32")
    tok = worker.tokenizer
    reference = WhisperForConditionalGeneration.from_pretrained(preset_dir, dtype=torch.float32).eval()
    detected = set()
    for audio in clips:
        payload = _payload(worker, audio, task)
        language, tokens = _decode(worker, payload)
        with torch.inference_mode():
            expected_language = int(reference.detect_language(payload["mel"])[0])
            generated = reference.generate(payload["mel"], task=task, max_new_tokens=224)[0].tolist()
        assert tok.languages[language] == expected_language
        assert tokens[:4] == [tok.sot, expected_language, tok.translate if task == "translate" else tok.transcribe,
                              tok.no_timestamps]
        assert tokens[4:] == generated  # transformers returns the tokens after the prompt
        detected.add(language)
        # a language given by the caller is used as it is
        given = worker.new_request("g", _payload(worker, audio, task, "de"), live=True)
        assert given.language == "de" and given.windows[0].prompt[1] == tok.languages["de"]
    assert detected <= set(tok.languages)


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    server = OmniServer("whisper", tmp_path_factory.mktemp("whisper-multilingual-serve"), "--preset",
                        "tiny-multilingual", "--option", "dtype=float32", OMNI_PLUGINS="whisper")
    server.wait_ready()
    yield openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)
    server.stop()


def _wav(audio: np.ndarray) -> bytes:
    out = io.BytesIO()
    sf.write(out, audio, 16000, format="WAV", subtype="FLOAT")  # the samples exactly
    return out.getvalue()


def test_server_detects_the_language_and_translates(client, preset_dir, clips):
    worker = DecoderWorker(preset_dir, "float32")
    upload = ("speech.wav", _wav(clips[0]))
    detected, translated_tokens = _decode(worker, _payload(worker, clips[0], "translate"))
    translation = client.audio.translations.create(model="whisper", file=upload)
    assert translation.text == worker.tokenizer.decode(translated_tokens).strip()
    verbose = client.audio.translations.create(model="whisper", file=upload, response_format="verbose_json")
    assert (verbose.task, verbose.language) == ("translate", LANGUAGES[detected])  # (with timestamps: other tokens)
    transcription = client.audio.transcriptions.create(model="whisper", file=upload, response_format="verbose_json")
    assert (transcription.task, transcription.language) == ("transcribe", LANGUAGES[detected])
    german = client.audio.transcriptions.create(model="whisper", file=upload, language="de", response_format="verbose_json")
    assert german.language == "german"  # verbose_json names the language, as OpenAI does
    for spelled in ("German", " DE "):  # names and codes, any case, are taken for the code
        named = client.audio.transcriptions.create(model="whisper", file=upload, language=spelled, response_format="verbose_json")
        assert (named.language, named.text) == ("german", german.text)
    with pytest.raises(openai.BadRequestError, match="unknown language 'xx'"):
        client.audio.transcriptions.create(model="whisper", file=upload, language="xx")


def test_a_preset_warns_once_that_its_transcripts_are_noise_and_the_real_checkpoint_does_not(tmp_path, caplog):
    import logging

    from omni_whisper.bundled import bundled_model_dir
    from omni_whisper.presets import MARKER
    from omni_whisper.topology import build

    (tmp_path / MARKER).write_text("tiny")  # what the presets write beside their random weights
    with caplog.at_level(logging.WARNING, logger="omni.presets"):
        for directory in (str(tmp_path), str(tmp_path), str(bundled_model_dir())):
            build(directory, {})
    assert [r.getMessage() for r in caplog.records if r.name == "omni.presets"] == [
        f"whisper: {tmp_path} holds the 'tiny' preset (random weights): its transcript is noise"]
