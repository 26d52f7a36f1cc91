"""Transport throughput and per-message latency: inproc, shm and zmq side by side in one run.

    python benchmarks/transports.py [--sizes 1KB,1MB,64MB] [--markdown FILE]

Each transport moves one float32 tensor per message from a sender to a receiver that rebuilds
the payload (``Transport.unpack``) and reads one element of it, then acknowledges:
- inproc: two threads of one process, handing the payload over a queue;
- shm: two processes, control frames over zmq ipc, tensor bytes in /dev/shm;
- zmq: two processes, tensor bytes as zmq frames over tcp on 127.0.0.1.
Latency is the median time from ``pack`` to the receiver's acknowledgement, one message at a
time. Throughput sends a window of messages before waiting for their acknowledgements.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import queue
import statistics
import sys
import tempfile
import threading
import time
import uuid

import torch
import zmq
from omni_core.hooks import PluginManager

SIZES = {"1KB": 1 << 10, "1MB": 1 << 20, "64MB": 64 << 20}


def _transport(name: str, prefix: str):
    return PluginManager(selection=set()).transport(name).factory({"prefix": prefix})


def _receiver_process(name: str, prefix: str, inbox: str, outbox: str) -> None:
    transport = _transport(name, prefix)
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    pull.connect(inbox)
    push.connect(outbox)
    while True:
        frames = pull.recv_multipart(copy=False)
        if frames[0].bytes == b"stop":
            break
        payload = transport.unpack(frames)
        float(payload["x"][-1])  # the data is there and readable
        del payload
        push.send(b"ack")
    pull.close(0)
    push.close(0)
    context.term()


class ProcessPair:
    """A sender here, a receiver in a spawned process, a tiny ack back."""

    def __init__(self, name: str):
        self.prefix = f"omni-bench-{uuid.uuid4().hex[:8]}"
        self.transport = _transport(name, self.prefix)
        self.context = zmq.Context()
        self.push, self.pull = self.context.socket(zmq.PUSH), self.context.socket(zmq.PULL)
        if name == "zmq":
            inbox = f"tcp://127.0.0.1:{self.push.bind_to_random_port('tcp://127.0.0.1')}"
            outbox = f"tcp://127.0.0.1:{self.pull.bind_to_random_port('tcp://127.0.0.1')}"
        else:
            self.dir = tempfile.mkdtemp(prefix="omni-bench-")
            inbox, outbox = f"ipc://{self.dir}/in", f"ipc://{self.dir}/out"
            self.push.bind(inbox)
            self.pull.bind(outbox)
        self.process = multiprocessing.get_context("spawn").Process(
            target=_receiver_process, args=(name, self.prefix, inbox, outbox), daemon=True
        )
        self.process.start()

    def send(self, request_id: str, payload: dict) -> None:
        self.push.send_multipart(self.transport.pack(request_id, payload), copy=False)

    def wait_ack(self) -> None:
        self.pull.recv()

    def close(self) -> None:
        self.push.send(b"stop")
        self.process.join(timeout=10)
        self.push.close(0)
        self.pull.close(0)
        self.context.term()
        self.transport.close()


class ThreadPair:
    """inproc: the receiver is a thread of this process; payloads are passed by reference."""

    def __init__(self):
        self.transport = _transport("inproc", "omni-bench")
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self.acks: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            frames = self.inbox.get()
            if frames is None:
                return
            payload = self.transport.unpack(frames)
            float(payload["x"][-1])
            self.acks.put(True)

    def send(self, request_id: str, payload: dict) -> None:
        self.inbox.put(self.transport.pack(request_id, payload))

    def wait_ack(self) -> None:
        self.acks.get()

    def close(self) -> None:
        self.inbox.put(None)
        self.thread.join()


def measure(pair, nbytes: int, iterations: int, window: int) -> dict[str, float]:
    tensor = torch.randn(nbytes // 4)
    for _ in range(3):  # warm up: first mappings, socket buffers
        pair.send("warm", {"x": tensor})
        pair.wait_ack()
    latencies = []
    for i in range(iterations):
        start = time.perf_counter()
        pair.send(f"lat-{i}", {"x": tensor})
        pair.wait_ack()
        latencies.append(time.perf_counter() - start)
    sent = 0
    start = time.perf_counter()
    for i in range(iterations):
        pair.send(f"tp-{i}", {"x": tensor})
        sent += 1
        if sent >= window:
            pair.wait_ack()
            sent -= 1
    for _ in range(sent):
        pair.wait_ack()
    elapsed = time.perf_counter() - start
    return {"latency_ms": statistics.median(latencies) * 1e3, "gbps": nbytes * iterations / elapsed / 1e9}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1KB,1MB,64MB")
    parser.add_argument("--transports", default="inproc,shm,zmq")
    parser.add_argument("--markdown", help="also write the results table to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [s.strip() for s in args.sizes.split(",")]
    names = [n.strip() for n in args.transports.split(",")]
    pairs = {name: ThreadPair() if name == "inproc" else ProcessPair(name) for name in names}
    rows = []
    try:
        for size in sizes:
            nbytes = SIZES[size]
            iterations = 2000 if nbytes <= 1 << 10 else 300 if nbytes <= 1 << 20 else 20
            window = 16 if nbytes <= 1 << 20 else 4
            for name in names:  # side by side: every transport at this size before the next size
                result = measure(pairs[name], nbytes, iterations, window)
                rows.append((size, name, result))
                print(
                    f"{size:>5} {name:>6}: {result['latency_ms']:9.3f} ms  {result['gbps']:8.3f} GB/s",
                    flush=True,
                )
    finally:
        for pair in pairs.values():
            pair.close()
    table = render(rows, names)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)


def render(rows, names) -> str:
    machine = f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {sys.version.split()[0]}, torch {torch.__version__}"
    lines = [
        "| size | transport | latency (median, ms) | throughput (GB/s) | throughput vs zmq |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    by_size: dict[str, dict[str, dict]] = {}
    for size, name, result in rows:
        by_size.setdefault(size, {})[name] = result
    for size, results in by_size.items():
        base = results.get("zmq", {}).get("gbps")
        for name in names:
            r = results[name]
            ratio = f"{r['gbps'] / base:.2f}x" if base else "-"
            lines.append(f"| {size} | {name} | {r['latency_ms']:.3f} | {r['gbps']:.3f} | {ratio} |")
    return f"Machine: {machine}.\n\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
