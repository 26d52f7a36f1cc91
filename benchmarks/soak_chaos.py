"""A bounded soak with chaos: mixed traffic at a fixed rate against real `omni serve` processes
whose stages run in their own processes, one of them SIGKILLed every few seconds.

    python benchmarks/soak_chaos.py --minutes 4 --rate 1 --kill-every 20 --json soak.json

Traffic (Poisson arrivals, seeded; shares in soak_traffic.MIX): speech streamed as SSE and whole
wav from the speech server, transcriptions from the transcription server, and voices saved,
listed and deleted. Every ``--kill-every`` seconds a random stage process of a random server is
SIGKILLed (the server restarts it). Every ``--sample-every`` seconds each server's RSS and open
file descriptors (its own and its stages') and the entries of /dev/shm are taken from /proc.

At the end the arrivals stop, requests still running get ``--grace`` seconds, and those left are
"never ended". Reported: requests by kind and status, p50/p99 latency of the successes, which
failures had a kill of their server during them (or shortly before), the RSS/fd/shm trend,
voices lost or returned (a ledger checked by every listing, at the end and on disk), stage
processes left alive and /dev/shm entries left after the servers stop, and each server's
shutdown time. Linux only (/proc). The servers run the working tree's omni.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import numpy as np
from serve_bench import start_server
from soak_traffic import Outcome, Traffic, now_since, saved_voices, server_of
from soak_watch import Sample, children, owner_running, running, sample, shm_entries, stage_pids

# A failure counts as caused by a kill when one hit its server while it ran or this soon before
# it started (a restart takes a few seconds, during which the stage is missing).
KILL_SHADOW_S = 15.0


async def soak(args, servers: dict[str, tuple], models: dict[str, str], workdir: Path) -> dict:
    clock = now_since(time.monotonic())
    urls = {name: url for name, (_, url) in servers.items()}
    traffic = Traffic(urls, models, workdir / "audio", clock, args.seed, args.timeout)
    await traffic.prepare()
    outcomes: list[Outcome] = []
    running: dict[asyncio.Task, tuple[str, float]] = {}
    samples: list[Sample] = []
    prefixes = {name: set() for name in servers}  # each pipeline's shared-memory prefix, once seen
    kills: list[dict] = []
    rng = random.Random(args.seed + 1)
    duration = args.minutes * 60.0

    async def arrivals() -> None:
        kinds = traffic.kinds()
        due = 0.0
        while True:
            due += rng.expovariate(args.rate)
            if due >= duration:
                return
            await asyncio.sleep(max(0.0, due - clock()))
            kind = rng.choices(list(kinds), weights=list(kinds.values()))[0]
            task = asyncio.create_task(traffic.send(kind))
            running[task] = (kind, clock())
            task.add_done_callback(finished)

    def finished(task: asyncio.Task) -> None:
        kind, start = running.pop(task)
        if task.cancelled():
            return  # counted as never ended by the code that cancelled it
        if task.exception() is not None:  # a fault of the soak's own code: shown, not hidden
            outcomes.append(Outcome(kind, server_of(kind), start, clock(), "soak_error", repr(task.exception())))
        else:
            outcomes.extend(task.result())

    async def killer() -> None:
        while True:
            await asyncio.sleep(args.kill_every)
            name = rng.choice(sorted(servers))
            pids = stage_pids(servers[name][0].pid)
            if not pids:
                kills.append({"at_s": round(clock(), 1), "server": name, "pid": None})
                continue
            pid = rng.choice(pids)
            os.kill(pid, signal.SIGKILL)
            kills.append({"at_s": round(clock(), 1), "server": name, "pid": pid})
            print(f"{clock():6.1f} s  killed {name} stage pid {pid}; {len(outcomes)} done, {len(running)} running",
                  flush=True)

    async def sampler() -> None:
        while True:
            for name, (process, _) in servers.items():
                samples.append(sample(clock(), name, process.pid, prefixes[name]))
            await asyncio.sleep(args.sample_every)

    background = [asyncio.create_task(killer()), asyncio.create_task(sampler())]
    await arrivals()
    for task in background:
        task.cancel()
    print(f"{clock():6.1f} s  arrivals over; waiting up to {args.grace:.0f} s for {len(running)} running", flush=True)
    if running:
        await asyncio.wait(list(running), timeout=args.grace)
    never_ended = [Outcome(kind, server_of(kind), start, None, "never_ended") for kind, start in running.values()]
    # Where the requests that never ended wait, as the servers' own gauges tell, before they go.
    stuck = {name: await stage_gauges(traffic.clients[name]) for name in sorted({o.server for o in never_ended})}
    for name in stuck:
        stuck[name]["stacks"] = dump_stacks(servers[name][0].pid, workdir / f"{name}-stuck-stacks.txt")
    for task in list(running):
        task.cancel()
    await asyncio.sleep(5.0)  # the last kill's restart, and the cancelled requests' aborts
    # Does each server still answer a request of its own kind once the soak's load is gone?
    after = {}
    for name, kind in (("speech", "speech_whole"), ("transcription", "transcription")):
        if name in servers:
            try:
                outcome = (await asyncio.wait_for(traffic.send(kind), timeout=30.0))[0]
                after[name] = f"{outcome.status} in {outcome.latency_s:.1f} s"
            except asyncio.TimeoutError:
                after[name] = "no answer in 30 s"
    # The last word on voices: once more through the API.
    try:
        listing = await traffic.clients["speech"].get("/v1/audio/voices", timeout=30.0)
        listed = saved_voices(listing.json()) if listing.status_code == 200 else None
    except httpx.HTTPError:
        listed = None
    if listed is None:
        traffic.ledger.mismatches.append(f"{clock():.1f} s: the final listing of voices got no answer")
        stuck.setdefault("speech", {})["stacks"] = dump_stacks(servers["speech"][0].pid,
                                                              workdir / "speech-unanswered-stacks.txt")
    else:
        traffic.ledger.check(listed, clock())
    for name, (process, _) in servers.items():
        samples.append(sample(clock(), name, process.pid, prefixes[name]))
    shm_at_end = sorted(shm_entries(set().union(*prefixes.values())))
    shm_of_dead = [name for name in shm_at_end if not owner_running(name)]  # while the servers still run
    await traffic.aclose()
    return {
        "outcomes": outcomes + never_ended, "samples": samples, "shm_at_end": shm_at_end,
        "shm_of_dead": shm_of_dead, "kills": kills, "elapsed_s": clock(),
        "shm_prefixes": sorted(set().union(*prefixes.values())), "stuck": stuck,
        "answers_after": after,
        "voices": {"pinned": traffic.pinned, "live": {**traffic.ledger.kept, **traffic.ledger.live},
                   "saved": traffic.ledger.created, "deleted": len(traffic.ledger.deleted),
                   "listed_at_end": None if listed is None else len(listed), "mismatches": traffic.ledger.mismatches,
                   "doubtful": sorted(traffic.ledger.doubtful)},
    }


async def stage_gauges(client: httpx.AsyncClient) -> dict:
    """/health's answer and the requests each stage holds or queues, from /metrics."""
    try:
        health = await client.get("/health", timeout=10)
        metrics = await client.get("/metrics", timeout=10)
    except httpx.HTTPError as exc:
        return {"error": repr(exc)}
    wanted = ("omni_stage_requests{", "omni_stage_queue_depth{", "omni_running_requests ", "omni_queue_depth ")
    lines = [line for line in metrics.text.splitlines() if line.startswith(wanted)]
    return {"health": f"{health.status_code} {health.text[:200]}", "gauges": lines}


def dump_stacks(server_pid: int, path: Path) -> str:
    """Every thread's Python stack of the server and its stages, with py-spy where installed."""
    if shutil.which("py-spy") is None:
        return "py-spy is not installed: no stacks"
    with open(path, "w") as out:
        for pid in [server_pid, *stage_pids(server_pid)]:
            out.write(f"== pid {pid}\n")
            out.flush()
            subprocess.run(["py-spy", "dump", "--pid", str(pid)], stdout=out, stderr=subprocess.STDOUT, timeout=60,
                           check=False)
    return str(path)


def latency_summary(outcomes: list[Outcome]) -> dict:
    by_status: dict[str, int] = {}
    for outcome in outcomes:
        by_status[outcome.status] = by_status.get(outcome.status, 0) + 1
    ok = [o.latency_s * 1000 for o in outcomes if o.status == "200"]
    p50, p99 = np.percentile(ok, [50, 99]) if ok else (None, None)
    return {"requests": len(outcomes), "by_status": dict(sorted(by_status.items())),
            "p50_ms": None if p50 is None else round(float(p50)), "p99_ms": None if p99 is None else round(float(p99))}


def killed_during(outcome: Outcome, kills: list[dict], end_s: float) -> bool:
    finish = outcome.end_s if outcome.end_s is not None else end_s
    return any(k["server"] == outcome.server and outcome.start_s - KILL_SHADOW_S <= k["at_s"] <= finish
               for k in kills if k["pid"])


def stage_of_pids(log_text: str) -> dict[int, str]:
    """The server logs each death as ``stage 'flow': process 123 died (exit code -9)``."""
    return {int(pid): stage for stage, pid in re.findall(r"stage '([^']+)': process (\d+) died", log_text)}


def voice_files(voices_dir: Path, live: dict[str, str]) -> list[str]:
    """Files in the voices directory that no live voice explains (a half-saved or lost voice)."""
    expected = {f"{voice_id}.{ext}" for voice_id in live for ext in ("wav", "json")}
    present = {p.name for p in voices_dir.iterdir() if p.name != ".lock"}  # the store's own lock file
    missing = sorted(expected - present)
    extra = sorted(present - expected)
    return [f"missing {n}" for n in missing] + [f"unexpected {n}" for n in extra]


def print_report(report: dict) -> None:
    print("\n== requests (latency of the 200s) ==")
    for kind, numbers in report["by_kind"].items():
        print(f"{kind:15s} {numbers['requests']:5d}  p50 {numbers['p50_ms']} ms  p99 {numbers['p99_ms']} ms  "
              f"{numbers['by_status']}")
    total = report["all"]
    print(f"{'all':15s} {total['requests']:5d}  p50 {total['p50_ms']} ms  p99 {total['p99_ms']} ms  {total['by_status']}")
    print(f"failures: {report['failures']['total']}, of which {report['failures']['with_a_kill']} had a kill of their "
          f"server during them or {KILL_SHADOW_S:.0f} s before; without one: {report['failures']['examples_without_kill']}")
    print(f"never ended: {report['never_ended']}")
    print(f"kills: {len(report['kills'])} by stage {report['kills_by_stage']}; deaths the servers logged: "
          f"{report['deaths_logged']}")
    print("\n== trend (MiB, fds) ==")
    print("   t s  server         stages  server RSS  stages RSS  server fds  stages fds  /dev/shm")
    for s in report["trend"]:
        print(f"{s['at_s']:6.0f}  {s['server']:13s} {s['stages']:6d} {s['server_rss_mib']:11.0f} {s['stages_rss_mib']:11.0f} "
              f"{s['server_fds']:11d} {s['stages_fds']:11d} {s['shm_entries']:9d}")
    print(f"\n/dev/shm: {report['shm']}")
    print(f"where the requests that never ended waited: {report['stuck']}")
    print(f"one request after the soak: {report['answers_after']}")
    print(f"tracebacks in the logs: {report['tracebacks_logged']}")
    print(f"voices: {report['voices']}")
    print(f"after stop: {report['after_stop']}")


def trend(samples: list[Sample], every_s: float = 60.0) -> list[dict]:
    """The first sample, one a minute, and the last, of each server."""
    kept, last_at = [], {}
    for s in samples:
        if s.server not in last_at or s.at_s - last_at[s.server] >= every_s:
            kept.append(s)
            last_at[s.server] = s.at_s
    for name in {s.server for s in samples}:
        final = [s for s in samples if s.server == name][-1]
        if final not in kept:
            kept.append(final)
    return [asdict(s) for s in sorted(kept, key=lambda s: (s.server, s.at_s))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=1.0, help="arrivals per second, all kinds together")
    parser.add_argument("--kill-every", type=float, default=20.0, help="seconds between two SIGKILLs")
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speech", default="--family cosyvoice3 --preset tiny", help="omni serve arguments")
    parser.add_argument("--transcription", default="--family whisper",
                        help="omni serve arguments of a second server; '' for none")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds one request may take")
    parser.add_argument("--grace", type=float, default=60.0)
    parser.add_argument("--workdir", default=None, help="logs, voices and audio (default: a temporary folder)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="omni-soak-"))
    workdir.mkdir(parents=True, exist_ok=True)
    shm_before = shm_entries()
    servers, logs = {}, {}
    try:
        for name, serve in (("speech", args.speech), ("transcription", args.transcription)):
            if not serve:
                continue
            logs[name] = workdir / f"{name}.log"
            extra = ["--stage-mode", "process", "--voices-dir", str(workdir / f"voices-{name}")]
            with open(logs[name], "w") as log:
                servers[name] = start_server([*shlex.split(serve), *extra], log)
        models = {name: httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
                  for name, (_, url) in servers.items()}
        print(f"servers ready: {({n: len(stage_pids(p.pid)) for n, (p, _) in servers.items()})} stage processes; "
              f"logs in {workdir}", flush=True)
        result = asyncio.run(soak(args, servers, models, workdir))
    finally:
        # every child (the stages, multiprocessing's resource tracker): none may outlive its server
        children_at_end = {name: children(p.pid) for name, (p, _) in servers.items()}
        shutdown = {}
        for name, (process, _) in servers.items():
            began = time.monotonic()
            process.send_signal(signal.SIGTERM)
            try:
                code = process.wait(timeout=60)
            except Exception:
                process.kill()
                code = "killed after 60 s"
            shutdown[name] = {"seconds": round(time.monotonic() - began, 1), "exit": code}
    time.sleep(1.0)
    alive = sorted({pid for pids in children_at_end.values() for pid in pids if running(pid)})
    log_text = {name: path.read_text(errors="replace") for name, path in logs.items()}
    stages = {}
    for name, text in log_text.items():
        stages.update({pid: f"{name}/{stage}" for pid, stage in stage_of_pids(text).items()})
    # A pid the logs never name died while it was still starting (a restart's retry follows).
    kills = [{**k, "stage": stages.get(k["pid"], "a stage still starting")} for k in result["kills"]]
    outcomes, end_s = result["outcomes"], result["elapsed_s"]
    failed = [o for o in outcomes if o.status != "200"]
    without = [o for o in failed if not killed_during(o, kills, end_s)]
    shm_during = {name: max((s.shm_entries for s in result["samples"] if s.server == name), default=0)
                  for name in servers}
    leftover = sorted(shm_entries(set(result["shm_prefixes"])))
    kinds = sorted({o.kind for o in outcomes})
    report = {
        "config": vars(args) | {"workdir": str(workdir)},
        "by_kind": {kind: latency_summary([o for o in outcomes if o.kind == kind]) for kind in kinds},
        "all": latency_summary(outcomes),
        "failures": {"total": len(failed), "with_a_kill": len(failed) - len(without),
                     "examples_without_kill": [f"{o.kind} {o.status} at {o.start_s:.0f} s: {o.detail}" for o in without[:5]]},
        "never_ended": sum(1 for o in outcomes if o.status == "never_ended"),
        "kills": kills,
        "kills_by_stage": {s: sum(1 for k in kills if k["stage"] == s) for s in sorted({k["stage"] for k in kills})},
        "deaths_logged": {name: len(stage_of_pids(text)) for name, text in log_text.items()},
        "tracebacks_logged": {name: text.count("Traceback") for name, text in log_text.items()},
        "trend": trend(result["samples"]),
        "shm": {"prefixes": result["shm_prefixes"], "max_during": shm_during, "left_after_stop": leftover[:20],
                "entries_of_the_machine_before_and_after": [len(shm_before), len(shm_entries())],
                "at_end_of_run": len(result["shm_at_end"]), "at_end_made_by_dead_processes": result["shm_of_dead"]},
        "stuck": result["stuck"],
        "answers_after": result["answers_after"],
        "voices": {**{k: v for k, v in result["voices"].items() if k != "live"},
                   "files": voice_files(workdir / "voices-speech", result["voices"]["live"])},
        "after_stop": {"shutdown": shutdown, "child_processes_left": alive},
        "samples": [asdict(s) for s in result["samples"]],
        "outcomes": [asdict(o) for o in outcomes],
    }
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
