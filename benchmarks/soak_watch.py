"""What a soak run watches of a server from outside, through Linux's /proc: its stage processes,
their memory and open file descriptors, and the entries of /dev/shm."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

SHM = "/dev/shm"
# A pipeline names its shared-memory segments omni-<10 hex digits>-...: other servers on the
# machine (other test runs) use other prefixes, which the soak must not count as its own.
_PIPELINE_SEGMENT = re.compile(r"/dev/shm/(omni-[0-9a-f]{10})-")


def children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's list: a child belongs to the thread that made it)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{task}/children") as handle:
                    found.extend(int(child) for child in handle.read().split())
            except OSError:
                continue
    except OSError:
        return []
    return sorted(set(found))


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def stage_pids(server_pid: int) -> list[int]:
    """The server's stage processes: children started by multiprocessing's spawn, less its
    resource tracker (killing that one tests nothing the server promises)."""
    return [
        pid for pid in children(server_pid)
        if "--multiprocessing-fork" in (line := _cmdline(pid)) and "resource_tracker" not in line
    ]


def running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def rss_mib(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def shm_entries(prefixes: set[str] | None = None) -> set[str]:
    """Entries of /dev/shm; only those of these pipelines' prefixes when given."""
    try:
        names = set(os.listdir(SHM))
    except OSError:
        return set()
    return names if prefixes is None else {n for n in names if any(n.startswith(p + "-") for p in prefixes)}


def owner_running(segment: str) -> bool:
    """Whether the process that made a segment (``<prefix>-<tag>-<pid>-<n>``) is still running."""
    parts = segment.rsplit("-", 2)
    return len(parts) == 3 and parts[1].isdigit() and running(int(parts[1]))


def segment_prefixes(pids: list[int]) -> set[str]:
    """The pipeline prefixes of the shared memory these processes have mapped."""
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as handle:
                found.update(_PIPELINE_SEGMENT.findall(handle.read()))
        except OSError:
            continue
    return found


@dataclass
class Sample:
    """One look at one server, ``at_s`` seconds into the run."""

    at_s: float
    server: str
    stages: int
    server_rss_mib: float
    stages_rss_mib: float
    server_fds: int
    stages_fds: int
    shm_entries: int


def sample(at_s: float, name: str, server_pid: int, prefixes: set[str]) -> Sample:
    """Also adds the prefixes the server's processes have mapped to ``prefixes`` (they stay
    known once seen, so that what a dead process left is still counted)."""
    stages = stage_pids(server_pid)
    prefixes.update(segment_prefixes([server_pid, *stages]))
    return Sample(
        at_s=round(at_s, 1), server=name, stages=len(stages),
        server_rss_mib=round(rss_mib(server_pid), 1),
        stages_rss_mib=round(sum(rss_mib(pid) for pid in stages), 1),
        server_fds=open_fds(server_pid), stages_fds=sum(open_fds(pid) for pid in stages),
        shm_entries=len(shm_entries(prefixes)),
    )
