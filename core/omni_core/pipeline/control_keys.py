"""Keys of the control sockets a stage on another host connects to (zmq CURVE): the runtime's
sockets take only the deployment's client key, and what crosses the network is encrypted.

The runtime binds with ``serve`` (its key pair, and a ZAP handler in its zmq context that lets in
``client_public`` alone); a stage connects with ``client_side()`` (the server's public key and
the client's pair), which travels to it with the stage's start arguments. Stages on the
runtime's host use loopback and no keys.
"""

from __future__ import annotations

from dataclasses import dataclass

import zmq
from zmq.auth.thread import ThreadAuthenticator


@dataclass(frozen=True)
class ControlKeys:
    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    @classmethod
    def new(cls) -> ControlKeys:
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq has no CURVE support: stages on other hosts cannot be reached safely")
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public, server_secret, client_public, client_secret)

    def client_side(self) -> dict[str, bytes]:
        """What a stage needs to connect: never the server's secret."""
        return {"server_public": self.server_public, "public": self.client_public, "secret": self.client_secret}


class OnlyOurClient:
    """ZAP credentials check: the deployment's client key, no other."""

    def __init__(self, client_public: bytes):
        self.client_public = client_public

    def callback(self, domain: str, key: bytes) -> bool:
        return key == self.client_public  # both in Z85 text, as zmq's authenticator passes keys


def authenticator(context: zmq.Context, keys: ControlKeys) -> ThreadAuthenticator:
    """A started ZAP handler for ``context`` that lets in ``keys``' client alone (stop it with the context)."""
    auth = ThreadAuthenticator(context)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=OnlyOurClient(keys.client_public))
    return auth


def serve(socket: zmq.Socket, keys: ControlKeys) -> None:
    """Make a socket the runtime binds a CURVE server (before it binds)."""
    socket.curve_secretkey = keys.server_secret
    socket.curve_publickey = keys.server_public
    socket.curve_server = True


def connect_with(socket: zmq.Socket, client: dict[str, bytes]) -> None:
    """Make a stage's socket a CURVE client of the runtime (before it connects)."""
    socket.curve_serverkey = client["server_public"]
    socket.curve_publickey = client["public"]
    socket.curve_secretkey = client["secret"]
