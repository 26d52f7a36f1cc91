"""A control channel whose peer is gone never holds its sender: a send waiting for room ends
when the channel is closed (a dead stage process's restart closes it) or when its timeout passes.
Found by a soak run: a thread routing to a stage whose process had just been killed sat in a
PUSH send forever, holding the channel's lock, and the stage's restart waited on that lock."""

from __future__ import annotations

import threading
import time

import pytest
import zmq
from omni_core.pipeline.control import Channel, ChannelClosed


@pytest.fixture
def orphan_push():
    """A bound PUSH socket no peer ever connects to: zmq holds its sends."""
    context = zmq.Context()
    push = context.socket(zmq.PUSH)
    push.bind_to_random_port("tcp://127.0.0.1")
    yield push
    if not push.closed:
        push.close(linger=0)
    context.term()


def test_close_ends_a_send_that_waits_for_a_peer(orphan_push):
    channel = Channel(orphan_push, None)
    outcome: list[BaseException | None] = []

    def send():
        try:
            channel.send({"op": "abort", "rid": "r1"})
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - what the sender saw is the result
            outcome.append(exc)

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(0.3)
    assert sender.is_alive() and not outcome  # waiting: nobody takes the message
    closing = threading.Thread(target=channel.close)
    closing.start()
    closing.join(timeout=5)
    sender.join(timeout=5)
    assert not closing.is_alive() and not sender.is_alive()
    assert len(outcome) == 1 and isinstance(outcome[0], ChannelClosed)
    with pytest.raises(ChannelClosed):
        channel.send({"op": "stop"})  # and every later send says so at once


def test_a_send_with_a_timeout_gives_up(orphan_push):
    channel = Channel(orphan_push, None)
    began = time.monotonic()
    with pytest.raises(ChannelClosed, match="took no message"):
        channel.send({"op": "stop"}, timeout_s=0.2)
    assert time.monotonic() - began < 5


def test_a_send_goes_through_once_a_peer_connects(orphan_push):
    channel = Channel(orphan_push, None)
    address = orphan_push.getsockopt_string(zmq.LAST_ENDPOINT)
    pull = zmq.Context.instance().socket(zmq.PULL)

    def connect_later():
        time.sleep(0.2)
        pull.connect(address)

    threading.Thread(target=connect_later).start()
    channel.send({"op": "release", "rid": "r2"}, timeout_s=10)
    assert pull.poll(5000)
    assert len(pull.recv_multipart()) == 1
    pull.close(linger=0)
