"""End to end: `omni serve --family qwen3-omni --preset tiny` answers the official `openai`
client's chat completions with text, audio, image and video parts, streamed and not; bad input
is a 400 in OpenAI's error shape that names the part, and the server stays healthy with every KV
block free afterwards."""

from __future__ import annotations

import base64
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from .conftest import mp4, noise, openai_client, png, tiny_server, wav


@pytest.fixture(scope="module")
def server(omni_cache, tiny_dir, tmp_path_factory):
    with tiny_server(omni_cache, tmp_path_factory.mktemp("qwen3-omni-serve"), "max_model_len=1024", "max_images=3") as proc:
        yield proc


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def mixed_content() -> list[dict]:
    return [
        {"type": "text", "text": "Listen, look and watch:"},
        {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav(noise(2.0))).decode(), "format": "wav"}},
        {"type": "image_url", "image_url": {"url": data_url("image/png", png(48, 64))}},
        {"type": "video_url", "video_url": {"url": data_url("video/mp4", mp4())}},
    ]


def test_text_audio_image_and_video_parts(client):
    reply = client.chat.completions.create(
        model="qwen3-omni", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": mixed_content()}],
        max_tokens=8, temperature=0, seed=1,
    )
    choice = reply.choices[0]
    assert choice.finish_reason in ("length", "stop") and choice.message.role == "assistant"
    assert reply.usage.completion_tokens <= 8 and reply.usage.prompt_tokens > 40  # media rows count as prompt tokens
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    # greedy and seeded: the same request gives the same text
    again = client.chat.completions.create(
        model="qwen3-omni", messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": mixed_content()}],
        max_tokens=8, temperature=0, seed=1,
    )
    assert again.choices[0].message.content == choice.message.content


def test_streamed_deltas_add_up_to_the_reply_and_end_with_usage(client):
    messages = [{"role": "user", "content": "Say something long."}]
    whole = client.chat.completions.create(model="qwen3-omni", messages=messages, max_tokens=24, temperature=0)
    stream = client.chat.completions.create(
        model="qwen3-omni", messages=messages, max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 24
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_multi_turn_and_stop_strings(client):
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a story."},
    ]
    full = client.chat.completions.create(model="qwen3-omni", messages=messages, max_tokens=32, temperature=0).choices[0].message.content
    visible = full.replace("\ufffd", "")
    assert len(visible) >= 3, f"the tiny preset's greedy reply is deterministic and should hold text to cut: {full!r}"
    stop = visible[len(visible) // 2 : len(visible) // 2 + 2]
    cut = client.chat.completions.create(model="qwen3-omni", messages=messages, max_tokens=32, temperature=0, stop=[stop, "\x00never"])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full[: full.index(stop)]


def test_concurrent_requests_with_different_media(client):
    def ask(seed: int) -> str:
        content = [{"type": "image_url", "image_url": {"url": data_url("image/png", png(32 + 16 * (seed % 3), 48, seed=seed))}},
                   {"type": "text", "text": f"Image {seed}?"}]
        return client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": content}], max_tokens=6, temperature=0).choices[0].message.content

    with ThreadPoolExecutor(6) as pool:
        together = list(pool.map(ask, range(6)))
    alone = [ask(seed) for seed in range(6)]
    assert together == alone


BAD = [
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, "remote URLs are not fetched"),
    ({"type": "image_url", "image_url": {"url": data_url("image/png", b"not an image")}}, "not an image"),
    ({"type": "video_url", "video_url": {"url": data_url("video/mp4", b"\x00" * 64)}}, "not a video"),
    ({"type": "input_audio", "input_audio": {"data": base64.b64encode(b"RIFF junk").decode(), "format": "wav"}}, "could not decode the audio"),
    ({"type": "input_audio", "input_audio": {"data": "%%%", "format": "wav"}}, "not valid base64"),
    ({"type": "file", "file": {"file_id": "x"}}, "unsupported content part type 'file'"),
]


@pytest.mark.parametrize(("part", "message"), BAD)
def test_bad_parts_are_400_naming_the_part(client, part, message):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}], max_tokens=4)
    body = err.value.body
    assert set(body) >= {"message", "type", "param", "code"}
    assert message in body["message"]
    # the part is named in the message or, for errors the serving layer finds, in ``param``
    where = "messages[0].content[1]"
    assert where in body["message"] or (body["param"] or "").startswith(where), body


def test_limits_are_400s(client):
    images = [{"type": "image_url", "image_url": {"url": data_url("image/png", png(32, 32, seed=i))}} for i in range(4)]
    with pytest.raises(openai.BadRequestError, match="at most 3 image"):
        client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": images}], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="the prompt takes"):
        client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": "word " * 300}], max_tokens=4)
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": "hi"}], stop=["a", "b", "c", "d", "e"])


def test_big_seeds_and_long_stop_strings(client):
    reply = client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=(1 << 63) - 1,
                                           stop="a stop string longer than four characters")
    assert reply.usage.completion_tokens >= 1
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": "hi"}], max_tokens=4, seed=1 << 64)


def test_server_healthy_and_every_kv_block_free_after(server, client):
    test_bad_parts_are_400_naming_the_part(client, *BAD[1])
    reply = client.chat.completions.create(model="qwen3-omni", messages=[{"role": "user", "content": "still there?"}], max_tokens=3)
    assert reply.usage.completion_tokens >= 1
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    usage = re.search(r'omni_kv_cache_usage\{stage="thinker"\} ([0-9.e+-]+)', metrics)
    assert usage and float(usage.group(1)) == 0.0
    models = client.models.list()
    assert [m.id for m in models.data] == ["qwen3-omni"]


def test_each_stage_in_its_own_process_gives_the_same_reply(tiny_dir):
    """Placement is configuration: prompts, media rows, deepstack features and positions cross
    process boundaries (shared memory) and the reply is the in-process one."""
    from omni_core import Omni

    messages = [{"role": "user", "content": [
        {"type": "audio", "audio": noise(1.5).numpy(), "sample_rate": 16000},
        {"type": "image", "image": png(40, 60)}, {"type": "text", "text": "hi"},
    ]}]
    replies = []
    for mode in ("inproc", "process"):
        with Omni(family="qwen3-omni", checkpoint_dir=tiny_dir, stage_mode=mode) as omni:
            replies.append(omni.chat(messages, sampling={"temperature": 0, "max_tokens": 8}))
    assert replies[0].text == replies[1].text and replies[0].usage == replies[1].usage
