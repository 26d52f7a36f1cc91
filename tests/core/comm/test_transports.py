"""Transports through the plugin manager: framing round trips, zero-copy shm receive, segment
cleanup on release and close, refusal of what cannot travel, nccl's clear error without GPUs."""

from __future__ import annotations

import gc
import glob
import os
import uuid

import msgpack
import numpy as np
import pytest
import torch
import zmq
from omni_core.comm.base import TransportUnavailable
from omni_core.comm.framing import FramingError
from omni_core.hooks import PluginManager


@pytest.fixture(scope="module")
def plugins():
    return PluginManager(selection=set())


def make(plugins, name):
    prefix = f"omni-test-{uuid.uuid4().hex[:8]}"
    return plugins.transport(name).factory({"prefix": prefix}), prefix


def sample_payload():
    return {
        "text": "héllo",
        "n": 3,
        "ok": True,
        "none": None,
        "raw": b"\x00\x01",
        "floats": torch.randn(3, 5),
        "half": torch.randn(4).to(torch.bfloat16),
        "mask": torch.tensor([True, False]),
        "ids": torch.arange(6).reshape(2, 3).T,  # not contiguous
        "empty": torch.zeros(0, 4),
        "scalar": torch.tensor(2.5),
        "array": np.arange(4, dtype=np.int16),
        "nested": {"list": [1, torch.ones(2)], "tuple": (1, 2)},
    }


def check_equal(got, want):
    for key in want:
        if isinstance(want[key], torch.Tensor):
            assert got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]), key
        elif isinstance(want[key], np.ndarray):
            assert isinstance(got[key], np.ndarray) and np.array_equal(got[key], want[key])
    assert got["text"] == "héllo" and got["raw"] == b"\x00\x01" and got["none"] is None and got["ok"] is True
    assert torch.equal(got["nested"]["list"][1], torch.ones(2)) and got["nested"]["tuple"] == [1, 2]


@pytest.mark.parametrize("name", ["shm", "zmq"])
def test_payload_round_trips_between_two_real_zmq_sockets(plugins, name):
    sender, prefix = make(plugins, name)
    receiver = plugins.transport(name).factory({"prefix": prefix})
    context = zmq.Context()
    push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    try:
        want = sample_payload()
        push.send_multipart(sender.pack("req-1", want), copy=False)
        got = receiver.unpack(pull.recv_multipart(copy=False))
        check_equal(got, want)
        assert glob.glob(f"/dev/shm/{prefix}*") == []  # the receiver unlinked the segment on receipt
    finally:
        push.close(0)
        pull.close(0)
        context.term()
        sender.close()


def entries(prefix):
    return sorted(glob.glob(f"/dev/shm/{prefix}*"))


def test_shm_pool_is_zero_copy_and_reuses_a_segment_once_the_receiver_frees_it(plugins):
    shm, prefix = make(plugins, "shm")
    big = torch.randn(256, 1024)  # 1 MB: a pooled segment
    first = shm.unpack(shm.pack("req-a", {"x": big, "y": torch.ones(3)}))
    assert torch.equal(first["x"], big) and len(entries(prefix)) == 1
    # both tensors read one mapping: their storages are views into the same region
    gap = first["y"].untyped_storage().data_ptr() - first["x"].untyped_storage().data_ptr()
    assert 0 < gap < big.numel() * 4 + 128
    segment = entries(prefix)[0]

    second = shm.unpack(shm.pack("req-b", {"x": big * 2}))  # the first is still held: a new segment
    assert len(entries(prefix)) == 2 and torch.equal(second["x"], big * 2)
    del first
    gc.collect()
    third = shm.unpack(shm.pack("req-c", {"x": big * 3}))  # refills the freed one
    assert segment in entries(prefix) and len(entries(prefix)) == 2  # no third segment
    assert torch.equal(third["x"], big * 3)
    assert torch.equal(second["x"], big * 2)  # untouched by the refill

    small = shm.pack("req-s", {"x": torch.arange(10)})
    assert len(small) == 2 and len(entries(prefix)) == 2  # small tensors ride inline, no segment
    assert torch.equal(shm.unpack(small)["x"], torch.arange(10))

    shm.pack("req-d", {"x": big})  # never received (its request aborts): no free segment left, a third
    assert len(entries(prefix)) == 3
    shm.release("req-d")
    assert len(entries(prefix)) == 2
    shm.close()
    assert entries(prefix) == []
    assert torch.equal(third["x"], big * 3)  # a receiver's mapping outlives the name


def test_shm_one_off_segments_are_unlinked_on_receipt_or_release(plugins):
    prefix = f"omni-test-{uuid.uuid4().hex[:8]}"
    shm = plugins.transport("shm").factory({"prefix": prefix, "inline_bytes": 0, "pool_bytes": 0})
    got = shm.unpack(shm.pack("req-a", {"x": torch.arange(5)}))
    assert torch.equal(got["x"], torch.arange(5)) and entries(prefix) == []  # unlinked on receipt
    shm.pack("req-b", {"x": torch.ones(10)})
    shm.pack("req-b", {"x": torch.ones(10)})
    kept = shm.pack("req-c", {"x": torch.ones(10)})
    assert len(entries(prefix)) == 3
    shm.release("req-b")  # aborted request: its two segments go, req-c's stays
    assert len(entries(prefix)) == 1
    shm.release_process(os.getpid())  # what a dead sender left behind
    assert entries(prefix) == []
    with pytest.raises(FramingError, match="is gone"):
        shm.unpack(kept)


def test_what_cannot_travel_is_refused_and_nothing_received_is_unpickled(plugins):
    transport, _ = make(plugins, "zmq")
    with pytest.raises(FramingError, match="type object cannot cross a process boundary"):
        transport.pack("r", {"thing": object()})
    header = msgpack.unpackb(bytes(transport.pack("r", {"x": torch.ones(4)})[0]))
    header["tensors"][0]["shape"] = [1000]  # a sender lying about the size
    with pytest.raises(FramingError, match="does not fit"):
        transport.unpack([msgpack.packb(header), torch.ones(4).numpy().tobytes()])
    header["tensors"][0].update(shape=[4], dtype="object")
    with pytest.raises(FramingError, match="unknown tensor dtype 'object'"):
        transport.unpack([msgpack.packb(header), torch.ones(4).numpy().tobytes()])
    shm, prefix = make(plugins, "shm")
    forged = msgpack.packb(
        {"body": msgpack.packb({}), "tensors": [], "offsets": [], "segment": "../etc", "size": 1}
    )
    with pytest.raises(FramingError, match="not one of this pipeline's"):
        shm.unpack([forged])


def test_inproc_passes_the_same_objects(plugins):
    transport, _ = make(plugins, "inproc")
    payload = {"x": torch.ones(3)}
    assert transport.unpack(transport.pack("r", payload)) is payload
    assert plugins.transports()["inproc"].cross_process is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error shown where no GPU is visible")
def test_nccl_is_selectable_and_says_clearly_why_it_cannot_run_here(plugins):
    spec = plugins.transport("nccl")
    assert spec.cross_host and spec.cross_process
    with pytest.raises(TransportUnavailable, match="transport 'nccl' needs CUDA GPUs with NCCL: .*use 'shm'"):
        spec.factory({"prefix": "omni-test"})
    from omni_core.pipeline import Pipeline

    from tests.core.pipeline import toy_topologies as toy

    pipeline = Pipeline(
        toy.cosyvoice_like(),
        placement={"flow": "process"},
        transport="nccl",
        plugin_manager=plugins,
        rebuild=toy.cosyvoice_like,
    )
    with pytest.raises(TransportUnavailable, match="needs CUDA GPUs"):
        pipeline.start()  # refused before any stage process is spawned
    assert pipeline.stage_pids() == {}


def test_distributed_transport_moves_tensors_point_to_point_between_stage_processes():
    """The nccl transport's code path on the gloo backend (host tensors): the group forms across
    the runtime and two stage processes, and chunks stream through it in order."""
    import functools

    from omni_core.pipeline import Pipeline

    from tests.core.pipeline import toy_topologies as toy

    pipeline = Pipeline(
        toy.cosyvoice_like(),
        placement={"flow": "process", "hift": "process"},
        transport="nccl",
        transport_options={"backend": "gloo"},
        plugin_manager=toy.core_plugins(),
        rebuild=functools.partial(toy.build, "cosyvoice"),
    )
    with pipeline:
        assert pipeline._transport.world_size == 3 and not pipeline._transport.supports_restart
        # many at once: each stage process receives while it sends, both ways at the same time
        # (with a send that waits for the peer's receive, a thread that receives must never wait
        # behind one: that hung two runs in three before control.Channel split its locks)
        texts = ["point", "to", "tniop"] + [f"request number {i} " * 3 for i in range(60)]
        handles = {text: pipeline.submit({"text": text}) for text in texts}
        for text, handle in handles.items():
            events = handle.collect(timeout=60)["audio"]
            audio = torch.cat([e.payload["audio"] for e in events if "audio" in e.payload])
            assert torch.allclose(audio, toy.reference_cosyvoice(text))
