"""Whether the Ray cluster of a deployment is still there: a thread that probes its GCS.

Stage actors reach the runtime over zmq, so a lost head node (the GCS with it) does not stop the
data path at once: surviving actors keep serving until their raylets give up on the GCS, after
Ray's ``gcs_rpc_server_reconnect_timeout_s`` (60 s by default, environment
``RAY_gcs_rpc_server_reconnect_timeout_s``), and then Ray ends the runtime's process too. Without
GCS fault tolerance (an external Redis) the GCS does not come back. ``GcsWatch`` connects to the
GCS's port every ``PROBE_S``: while it refuses, the cluster is *unreachable* (nothing can be
placed or restarted); unreachable for ``lost_after_s`` (shorter than Ray's own timeout, so the
runtime ends in order before Ray ends it), the cluster is *lost* and ``on_lost`` is called once.
A GCS back before then (a fault-tolerant one restarted) makes the cluster reachable again.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable

PROBE_S = 0.5
LOST_AFTER_S = 30.0
SHUTDOWN_S = 5.0  # the time left for an orderly shutdown before Ray would end the process
RAY_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"


def lost_after_s(wanted: float | None = None) -> float:
    """How long the GCS may stay unreachable before the cluster counts as lost: ``wanted`` (else
    ``LOST_AFTER_S``), and at most ``SHUTDOWN_S`` less than Ray waits before it ends this process."""
    try:
        ray_waits = float(os.environ.get(RAY_RECONNECT_ENV, "60"))
    except ValueError:
        ray_waits = 60.0
    return max(1.0, min(wanted if wanted is not None else LOST_AFTER_S, ray_waits - SHUTDOWN_S))


class GcsWatch:
    def __init__(self, address: str, lost_after: float, on_lost: Callable[[str], None]):
        self.address = address  # host:port of the GCS
        self.lost_after = lost_after
        self.on_lost = on_lost
        self.unreachable_since: float | None = None
        self.lost: str | None = None  # why, once lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="omni-ray-gcs-watch", daemon=True)

    def start(self) -> GcsWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def problem(self) -> str | None:
        """Why the cluster cannot serve now (None: it can)."""
        if self.lost:
            return self.lost
        since = self.unreachable_since
        if since is None:
            return None
        left = max(0.0, self.lost_after - (time.monotonic() - since))
        return (
            f"the Ray cluster at {self.address} does not answer (its GCS is unreachable); "
            f"the server gives up in {left:.0f} s unless it comes back"
        )

    def _answers(self) -> bool:
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=PROBE_S * 2):
                return True
        except OSError:
            return False

    def _run(self) -> None:
        while not self._stop.wait(PROBE_S):
            if self._answers():
                self.unreachable_since = None
                continue
            now = time.monotonic()
            if self.unreachable_since is None:
                self.unreachable_since = now
            elif now - self.unreachable_since >= self.lost_after:
                self.lost = (
                    f"the Ray cluster at {self.address} is lost: its GCS (the head node) has not answered "
                    f"for {self.lost_after:.0f} s"
                )
                self.on_lost(self.lost)
                return
