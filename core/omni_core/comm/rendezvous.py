"""The rendezvous of a torch.distributed group (the ``nccl`` transport's, on NCCL or gloo).

The runtime (rank 0) hosts a ``TCPStore`` listening on the address it is given and nothing
wider (torch's own listens on every interface). Every key the group uses lives under a secret
token that the runtime makes and gives only to the processes it starts, with their ranks: a
process without the token finds nothing it could join and is refused, and each rank joins
once. The group's own connections (gloo's, NCCL's) are torch's: ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` choose their interface.
"""

from __future__ import annotations

import os
import secrets
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from omni_core.comm.base import TransportUnavailable

_RUNTIME_KEY = "runtime"  # set by rank 0 under the token; what a joiner must find


@dataclass
class Rendezvous:
    store: Any  # the group's keys: a PrefixStore under the token
    address: str  # host:port of the runtime's TCPStore
    token: str
    _tcp_store: Any = None  # kept alive: the store above only wraps it


def _namespace(token: str) -> str:
    return f"omni/{token}"


def _listener(host: str) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.bind(address)
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    return sock


def host(host: str, world_size: int, timeout: timedelta, token: str | None = None) -> Rendezvous:
    """Rank 0's rendezvous, listening on ``host`` only (a free port); ``token`` made if not given."""
    import torch.distributed as dist

    listener = _listener(host)
    port = listener.getsockname()[1]
    # the store owns the socket from here (it closes it with itself)
    tcp_store = dist.TCPStore(
        host, port, world_size, True, wait_for_workers=False, timeout=timeout, master_listen_fd=listener.detach()
    )
    token = token or secrets.token_hex(16)
    store = dist.PrefixStore(_namespace(token), tcp_store)
    store.set(_RUNTIME_KEY, str(os.getpid()))
    return Rendezvous(store, f"{host}:{port}", token, tcp_store)


def join(address: str, token: str | None, rank: int, world_size: int, timeout: timedelta) -> Rendezvous:
    """A stage process's way in: refused (``TransportUnavailable``) without the runtime's token,
    for a rank the group does not have, or for a rank that has joined already."""
    import torch.distributed as dist

    store_host, _, port = address.rpartition(":")
    tcp_store = dist.TCPStore(store_host, int(port), world_size, False, timeout=timeout)
    refused = f"transport 'nccl': the rendezvous at {address} refused rank {rank}"
    if not token or not tcp_store.check([f"{_namespace(token)}/{_RUNTIME_KEY}"]):
        raise TransportUnavailable(f"{refused}: it was not given the runtime's token")
    if not 0 < rank < world_size:
        raise TransportUnavailable(f"{refused}: the group's ranks are 1..{world_size - 1}")
    store = dist.PrefixStore(_namespace(token), tcp_store)
    if store.add(f"rank/{rank}", 1) != 1:
        raise TransportUnavailable(f"{refused}: that rank has joined already")
    return Rendezvous(store, address, token, tcp_store)
