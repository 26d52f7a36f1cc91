"""int8 weights: the pipeline with ``dtype=int8`` still transcribes the spoken sentences (greedy,
word error rate at most 25%; the server test covers int8 too where it is the default); the int8
linear stays close to the float one; bad option values are refused before anything starts."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import jiwer
import pytest
import torch
from omni_core.api import Omni
from omni_whisper.int8 import Int8Linear, int8_supported
from omni_whisper.topology import build

pytestmark = pytest.mark.skipif(not int8_supported()[0], reason=int8_supported()[1] or "int8 supported")


def _words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def test_int8_linear_is_close_to_the_float_linear():
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(384, 1536)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(1536, 384, generator=generator) * 0.05)
    x = torch.randn(16, 384, generator=generator)
    expected = layer(x)
    got = Int8Linear(layer.weight, layer.bias)(x)
    assert got.shape == expected.shape and got.dtype == torch.float32
    relative = (got - expected).norm() / expected.norm()
    assert 0 < relative < 0.02  # quantised (not the float path), yet within 2%


@pytest.mark.parametrize("options", [{"dtype": "int4"}, {"threads": "many"}])
def test_bad_options_are_refused_when_the_topology_is_built(options):
    with pytest.raises(ValueError, match="whisper: (dtype|threads) must be"):
        build("unused", options)


@pytest.mark.parametrize("threads", ["split", "shared"])
def test_int8_pipeline_transcribes_spoken_sentences(threads, spoken_16k, sentences):
    with Omni(family="whisper", device="cpu", options={"dtype": "int8", "threads": threads}) as omni:
        with ThreadPoolExecutor(len(spoken_16k)) as pool:  # concurrent: rows share decoder steps
            texts = list(pool.map(lambda clip: omni.transcribe(clip, 16000).text, spoken_16k))
        decoder = omni.stats()["stages"]["decoder"]
    error_rate = jiwer.wer([_words(s) for s in sentences], [_words(t) for t in texts])
    assert error_rate <= 0.25, list(zip(sentences, texts, strict=True))
    assert decoder["rows"] == 0 and decoder["running"] == 0


def test_dtype_resolves_for_each_device():
    from omni_whisper.dtypes import resolve_dtype

    assert resolve_dtype("auto", "cuda:0") == "float16" and resolve_dtype("bfloat16", "cuda") == "bfloat16"
    assert resolve_dtype("auto", "cpu") in ("int8", "bfloat16", "float32")
    with pytest.raises(ValueError, match="int8 runs on CPUs only"):
        resolve_dtype("int8", "cuda")
