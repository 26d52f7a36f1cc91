"""The control sockets a stage on another host connects to take the deployment's client key
alone (zmq CURVE, checked by a ZAP handler): a plain socket and one with a key of its own, both
knowing the address and the server's public key, get none of the messages; the stage gets all."""

from __future__ import annotations

import time

import zmq
from omni_core.pipeline.control_keys import ControlKeys, authenticator, connect_with, serve


def test_only_the_deployments_client_receives():
    runtime, elsewhere = zmq.Context(), zmq.Context()
    keys = ControlKeys.new()
    auth = authenticator(runtime, keys)
    push = runtime.socket(zmq.PUSH)
    serve(push, keys)
    address = f"tcp://127.0.0.1:{push.bind_to_random_port('tcp://127.0.0.1')}"
    stage, plain, stranger = (elsewhere.socket(zmq.PULL) for _ in range(3))
    connect_with(stage, keys.client_side())
    public, secret = zmq.curve_keypair()
    connect_with(stranger, {"server_public": keys.server_public, "public": public, "secret": secret})
    for socket in (stage, plain, stranger):
        socket.connect(address)
    try:
        assert "server_secret" not in keys.client_side()
        assert push.poll(5000, zmq.POLLOUT)
        time.sleep(0.5)  # the others would have finished their handshakes too
        for i in range(6):
            push.send(b"message %d" % i)
        got = []
        while stage.poll(500):
            got.append(stage.recv())
        assert got == [b"message %d" % i for i in range(6)]  # PUSH deals round-robin: no other peer took one
        assert not plain.poll(200) and not stranger.poll(200)
    finally:
        for socket in (push, stage, plain, stranger):
            socket.close(linger=0)
        auth.stop()
        runtime.term()
        elsewhere.term()
