"""A real local Ray cluster of two nodes, every one bound to 127.0.0.1, for the Ray placement tests.

Each node has 2 logical CPUs, a small object store and a custom resource naming it
(``head_node``, ``far_node``) that a stage's bundle can ask for to land on that node. Every
process that talks to Ray gets ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` (Ray's address detection
then answers 127.0.0.1) and ``RAY_USAGE_STATS_ENABLED=0`` (no usage report leaves the machine):
``RAY_ENV``, set here before Ray is first imported and passed to subprocesses. Tests using it
skip where Ray is not installed.
"""

from __future__ import annotations

import contextlib
import os

import pytest

RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0"}
NODE = {
    "num_cpus": 2,
    "node_ip_address": "127.0.0.1",
    "object_store_memory": 80 << 20,
    "include_dashboard": False,
}
SKIP_REASON = "Ray is not installed: pip install './core[ray]' (bash scripts/setup.sh --test installs it)"


def import_ray():
    # Ray reads these when it is imported: set before the first import, kept for the process
    os.environ.update(RAY_ENV)
    return pytest.importorskip("ray", reason=SKIP_REASON)


@contextlib.contextmanager
def two_node_cluster(env: dict[str, str] | None = None, connect: bool = True):
    """Starts the cluster, connects this process to it, yields the ``Cluster``; stops both after.
    ``env``: variables the nodes start with, and so every actor's process (the nodes of a real
    cluster have the plugins installed; a test's plugin installed with ``--target`` needs its
    folder on PYTHONPATH). ``connect=False``: this process stays out of it (a test that kills the
    head node: Ray ends every driver of a cluster whose GCS stays away)."""
    ray = import_ray()
    from ray.cluster_utils import Cluster

    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        cluster = Cluster(initialize_head=True, head_node_args={**NODE, "resources": {"head_node": 8}})
    finally:
        _restore(saved)
    try:
        os.environ.update(env or {})
        try:
            cluster.add_node(**NODE, resources={"far_node": 8})
        finally:
            _restore(saved)
        cluster.wait_for_nodes()
        if connect:
            ray.init(address=cluster.address, log_to_driver=False)
        yield cluster
    finally:
        if connect:
            ray.shutdown()
        cluster.shutdown()


def _restore(saved: dict[str, str | None]) -> None:
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def live_actors() -> list[str]:
    """Ids of the cluster's actors that are not dead (the GCS's own table: no dashboard needed)."""
    import ray._private.state

    return [a["ActorID"] for a in ray._private.state.actors().values() if a["State"] != "DEAD"]


def live_placement_groups() -> list[str]:
    import ray

    return [pg_id for pg_id, pg in ray.util.placement_group_table().items() if pg["state"] != "REMOVED"]


def node_names() -> dict[str, str]:
    """Node id -> ``head_node`` or ``far_node``."""
    import ray

    names = {}
    for node in ray.nodes():
        for name in ("head_node", "far_node"):
            if name in node["Resources"]:
                names[node["NodeID"]] = name
    return names


def descendants(pid: int) -> set[int]:
    """``pid`` and every process below it (from /proc: the cluster's processes are children of
    the test process that started it, and its actors children of their raylet)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parent = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue  # ended meanwhile
            children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        current = todo.pop()
        found.add(current)
        todo.extend(children.get(current, []))
    return found


def listening_addresses(pids: set[int]) -> list[tuple[int, str]]:
    """(pid, local address) of every TCP socket those processes listen on (/proc/net/tcp{,6})."""
    inodes: dict[str, str] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # LISTEN
                    inodes[fields[9]] = _address(fields[1])
    found = []
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in inodes:
                found.append((pid, inodes[target[8:-1]]))
    return found


def _address(hex_address: str) -> str:
    """``0100007F:1F90`` (little-endian words) as ``127.0.0.1``; IPv6 as its 32 hex digits."""
    host = hex_address.split(":")[0]
    if len(host) == 8:
        return ".".join(str(b) for b in bytes.fromhex(host)[::-1])
    words = [bytes.fromhex(host[i : i + 8])[::-1].hex() for i in range(0, 32, 8)]
    return "".join(words)


def settled(check, timeout_s: float = 10.0):
    """``check()`` once it is falsy (an empty list...), or its last value after ``timeout_s``: the
    cluster's tables record an actor's death or a group's removal a moment after it happened."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if not value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def death_causes(pids: list[int]) -> dict[int, str]:
    """pid -> why the actor of that pid died, as Ray recorded it (``RAY_KILL``: ``ray.kill``,
    which shutdown calls, or ``REF_DELETED`` when its handle was dropped first; ``OWNER_DIED``:
    its runtime was gone first)."""
    import ray._private.state

    causes = {}
    for actor in ray._private.state.actors().values():
        if actor["Pid"] in pids:
            text = str(actor["DeathCause"])
            causes[actor["Pid"]] = next(
                (
                    r
                    for r in ("RAY_KILL", "REF_DELETED", "OWNER_DIED", "WORKER_DIED", "NODE_DIED")
                    if r in text
                ),
                text,
            )
    return causes
