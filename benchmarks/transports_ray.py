"""Across two Ray nodes: zmq over tcp against Ray's object store, at 1 MB and 64 MB.

    python benchmarks/transports_ray.py [--sizes 1MB,64MB] [--markdown FILE]

Starts a local cluster of two nodes bound to 127.0.0.1 (``ray.cluster_utils.Cluster``: each
node its own raylet and object store), keeps this process on the head node and puts a receiver
actor on the other node. Each message is one float32 tensor of the size; the receiver rebuilds
it, reads its last element and acknowledges:
- zmq: what the runtime does with a stage on another node: ``ZmqTransport.pack`` here, the
  frames over a PUSH socket bound on tcp 127.0.0.1, ``unpack`` in the actor, an ack back;
- ray: ``ray.put`` of the array here, its ObjectRef passed to an actor call that ``ray.get``s
  it (the object manager pulls it into the far node's store), the call's result the ack.
Latency is the median time from send to acknowledgement, one message at a time; throughput
keeps a window of messages in flight (16 at 1 MB, 4 at 64 MB). Nothing leaves loopback.
"""

from __future__ import annotations

import argparse
import os

# Ray reads these when it is imported: its address detection answers 127.0.0.1, and no usage
# report leaves the machine
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
import zmq  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

SIZES = {"1MB": 1 << 20, "64MB": 64 << 20}
NODE = {"num_cpus": 1, "node_ip_address": "127.0.0.1", "include_dashboard": False}


class Receiver:
    """On the far node: the zmq side reads frames from the runtime's socket; the Ray side gets
    objects by reference."""

    def connect(self, inbox: str, outbox: str) -> None:
        from omni_core.comm.zmq_transport import ZmqTransport

        self.transport = ZmqTransport()
        self.context = zmq.Context()
        self.pull, self.push = self.context.socket(zmq.PULL), self.context.socket(zmq.PUSH)
        self.pull.connect(inbox)
        self.push.connect(outbox)

    def serve_zmq(self, count: int) -> None:
        for _ in range(count):
            payload = self.transport.unpack(self.pull.recv_multipart(copy=False))
            float(payload["x"][-1])
            self.push.send(b"ack")

    def receive(self, refs: list) -> float:
        array = ray.get(refs[0])  # a list keeps Ray from resolving the ref before the call
        return float(torch.from_numpy(array)[-1])


def measure(send, wait, iterations: int, window: int, nbytes: int) -> dict[str, float]:
    for _ in range(3):  # first mappings, socket buffers, store allocations
        wait(send())
    latencies = []
    for _ in range(iterations):
        start = time.perf_counter()
        wait(send())
        latencies.append(time.perf_counter() - start)
    pending = []
    start = time.perf_counter()
    for _ in range(iterations):
        pending.append(send())
        if len(pending) >= window:
            wait(pending.pop(0))
    for ticket in pending:
        wait(ticket)
    elapsed = time.perf_counter() - start
    return {"latency_ms": statistics.median(latencies) * 1e3, "gbps": nbytes * iterations / elapsed / 1e9}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1MB,64MB")
    parser.add_argument("--markdown", help="also write the results table to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    sizes = [s.strip() for s in args.sizes.split(",")]
    store = max(SIZES[s] for s in sizes) * 8 + (64 << 20)  # a window of messages and their copies
    cluster = Cluster(
        initialize_head=True, head_node_args={**NODE, "object_store_memory": store, "resources": {"head": 1}}
    )
    rows = []
    try:
        cluster.add_node(**NODE, object_store_memory=store, resources={"far": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        receiver = ray.remote(num_cpus=0, resources={"far": 1})(Receiver).remote()
        from omni_core.comm.zmq_transport import ZmqTransport

        transport = ZmqTransport()
        context = zmq.Context()
        push, pull = context.socket(zmq.PUSH), context.socket(zmq.PULL)
        inbox = f"tcp://127.0.0.1:{push.bind_to_random_port('tcp://127.0.0.1')}"
        outbox = f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}"
        ray.get(receiver.connect.remote(inbox, outbox))
        for size in sizes:
            nbytes = SIZES[size]
            iterations, window = (300, 16) if nbytes <= 1 << 20 else (20, 4)
            tensor = torch.randn(nbytes // 4)
            array = tensor.numpy()
            serving = receiver.serve_zmq.remote(3 + 2 * iterations)

            def zmq_send(tensor=tensor):
                push.send_multipart(transport.pack("bench", {"x": tensor}), copy=False)

            result = measure(zmq_send, lambda _: pull.recv(), iterations, window, nbytes)
            ray.get(serving)
            rows.append((size, "zmq", result))
            print(f"{size:>5} zmq: {result['latency_ms']:9.3f} ms  {result['gbps']:7.3f} GB/s", flush=True)

            def ray_send(array=array):
                return receiver.receive.remote([ray.put(array)])

            result = measure(ray_send, ray.get, iterations, window, nbytes)
            rows.append((size, "ray object store", result))
            print(f"{size:>5} ray: {result['latency_ms']:9.3f} ms  {result['gbps']:7.3f} GB/s", flush=True)
        push.close(0)
        pull.close(0)
        context.term()
    finally:
        ray.shutdown()
        cluster.shutdown()
    table = render(rows)
    print(table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table)


def render(rows) -> str:
    machine = (
        f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {sys.version.split()[0]}, "
        f"torch {torch.__version__}, ray {ray.__version__}, numpy {np.__version__}"
    )
    lines = [
        "| size | path between nodes | latency (median, ms) | throughput (GB/s) |",
        "| --- | --- | ---: | ---: |",
    ]
    lines += [f"| {s} | {n} | {r['latency_ms']:.3f} | {r['gbps']:.3f} |" for s, n, r in rows]
    return f"Machine: {machine}.\n\n" + "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
