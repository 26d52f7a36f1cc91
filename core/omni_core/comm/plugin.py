"""The core's transports, registered through the same hook as any plugin's."""

from __future__ import annotations

from omni_core.hooks import TransportSpec, hookimpl


def _inproc(options):
    from omni_core.comm.inproc import InprocTransport

    return InprocTransport(**options)


def _shm(options):
    from omni_core.comm.shm import ShmTransport

    return ShmTransport(**options)


def _zmq(options):
    from omni_core.comm.zmq_transport import ZmqTransport

    return ZmqTransport(**options)


def _nccl(options):
    from omni_core.comm.nccl import NcclTransport

    return NcclTransport(**options)


@hookimpl
def omni_transports():
    return [
        TransportSpec("inproc", _inproc, "same process: passes references, no copy", cross_process=False),
        TransportSpec("shm", _shm, "shared memory between processes of one host; zero-copy receive"),
        TransportSpec("zmq", _zmq, "tensors as zmq frames over tcp; works across hosts", cross_host=True),
        TransportSpec(
            "nccl", _nccl, "torch.distributed point-to-point between GPU processes", cross_host=True
        ),
    ]
