"""The distributed transport's rendezvous on the real gloo backend over loopback: it listens on
the address it is given only, a process without the runtime's token (or with a rank the group
does not have, or has already) is refused, and the expected rank joins and receives a tensor."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
from omni_core.comm.base import TransportUnavailable
from omni_core.comm.nccl import NcclTransport

JOINER = """
import sys
import torch
from omni_core.comm.nccl import NcclTransport

transport = NcclTransport(rank=1, world_size=2, store=sys.argv[1], token=sys.argv[2], backend="gloo")
print(transport.pack("r", {"x": torch.arange(6.0)}, peer=0)[0].hex(), flush=True)
transport.flush(0)  # the tensor goes through the group
transport.close()
"""


def listening_on(port: int) -> list[str]:
    """The local addresses of the sockets that listen on ``port`` (IPv4 and IPv6)."""
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        if not os.path.exists(table):
            continue
        with open(table) as rows:
            next(rows)
            for row in rows:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                    words = bytes.fromhex(address)  # 32-bit words, each in host (little-endian) order
                    raw = b"".join(words[i : i + 4][::-1] for i in range(0, width, 4))
                    found.append(socket.inet_ntop(socket.AF_INET if width == 4 else socket.AF_INET6, raw))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads the socket table of Linux")
def test_the_rendezvous_listens_where_told_and_admits_the_expected_rank_only():
    runtime = NcclTransport(peers=1, backend="gloo", host="127.0.0.1")
    address = runtime.store_address
    token = runtime.peer_options(1)["token"]
    try:
        assert listening_on(int(address.rpartition(":")[2])) == ["127.0.0.1"]  # not 0.0.0.0 nor ::
        for wrong in (None, "not-the-token", token[:-1]):
            with pytest.raises(TransportUnavailable, match="refused rank 1: it was not given the runtime's token"):
                NcclTransport(rank=1, world_size=2, store=address, token=wrong, backend="gloo")
        with pytest.raises(TransportUnavailable, match=r"refused rank 2: the group's ranks are 1\.\.1"):
            NcclTransport(rank=2, world_size=2, store=address, token=token, backend="gloo")

        joiner = subprocess.Popen(
            [sys.executable, "-c", JOINER, address, token], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            header = joiner.stdout.readline()
            assert header, joiner.stderr.read()
            got = runtime.unpack([bytes.fromhex(header.strip())], peer=1)
            assert torch.equal(got["x"], torch.arange(6.0))
            with pytest.raises(TransportUnavailable, match="refused rank 1: that rank has joined already"):
                NcclTransport(rank=1, world_size=2, store=address, token=token, backend="gloo")
            assert joiner.wait(timeout=60) == 0, joiner.stderr.read()
        finally:
            joiner.kill()
            joiner.communicate()
    finally:
        runtime.close()
