"""One transport per peer: shared memory to the stage processes of the runtime's host, a
transport that crosses hosts to those elsewhere (stages placed on Ray nodes).

The runtime holds one ``PeerTransports``; each stage's side of the control plane uses the
transport of its peer (``for_peer``), and a stage process makes only that one.
"""

from __future__ import annotations

from typing import Any

from omni_core.comm.base import Transport


class PeerTransports(Transport):
    name = "per-peer"

    def __init__(self, transports: dict[int, Transport], default: Transport):
        super().__init__(default.prefix)
        self.default = default
        self.transports = transports
        self._all = list({id(t): t for t in [default, *transports.values()]}.values())

    @property
    def supports_restart(self) -> bool:  # type: ignore[override]
        return all(t.supports_restart for t in self._all)

    def for_peer(self, peer: int) -> Transport:
        return self.transports.get(peer, self.default)

    def pack(self, request_id: str, payload: dict[str, Any], peer: int = 0) -> list[Any]:
        return self.for_peer(peer).pack(request_id, payload, peer)

    def unpack(self, frames: list[Any], peer: int = 0) -> dict[str, Any]:
        return self.for_peer(peer).unpack(frames, peer)

    def flush(self, peer: int = 0) -> None:
        self.for_peer(peer).flush(peer)

    def peer_options(self, peer: int) -> dict[str, Any]:
        return self.for_peer(peer).peer_options(peer)

    def release(self, request_id: str) -> None:
        for transport in self._all:
            transport.release(request_id)

    def release_process(self, pid: int) -> None:
        # a pid names a process of this host only: it is the same-host transport's to sweep
        self.default.release_process(pid)

    def close(self) -> None:
        for transport in self._all:
            transport.close()
