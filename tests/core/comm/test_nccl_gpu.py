"""The nccl transport on two GPUs: CUDA tensors cross between the runtime (cuda:0) and a stage
process (cuda:1) by NCCL point-to-point. Skipped without two CUDA devices."""

from __future__ import annotations

import functools

import pytest
import torch
from omni_core.hooks import PluginManager
from omni_core.pipeline import Edge, Pipeline, StageSpec, Topology

needs_two_gpus = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two CUDA devices"
)


def ramp_factory(context):
    def run(message, emit):
        n = int(message.payload["n"])
        for chunk in range(3):
            x = torch.arange(n, device=context.device, dtype=torch.float32) + chunk
            emit("out", {"x": x, "chunk": chunk}, end=False)
        emit("out", {}, end=True)

    return run


def affine_factory(context):
    def run(message, emit):
        x = message.payload.get("x")
        if x is not None:
            emit("out", {"y": x * 2 + 1, "seen_on": str(x.device)}, end=False)
        if message.end:
            emit("out", {}, end=True)

    return run


def gpu_topology() -> Topology:
    return Topology(
        stages=[
            StageSpec("ramp", "fn", ramp_factory, device="cuda:0"),
            StageSpec("affine", "fn", affine_factory, device="cuda:1"),
        ],
        edges=[Edge("ramp.out", "affine.in", "stream")],
        entry="ramp.in",
        outputs={"y": "affine.out"},
    )


@needs_two_gpus
def test_cuda_tensors_cross_to_a_stage_process_on_another_gpu_and_back():
    pipeline = Pipeline(
        gpu_topology(),
        placement={"affine": "process"},
        transport="nccl",
        device="cuda:0",
        plugin_manager=PluginManager(selection=set()),
        rebuild=functools.partial(gpu_topology),
    )
    with pipeline:
        for n in (1024, 1 << 22):
            events = pipeline.submit({"n": n}).collect(timeout=120)["y"]
            chunks = [e.payload for e in events if "y" in e.payload]
            assert [c["seen_on"] for c in chunks] == ["cuda:1"] * 3  # arrived on the stage's GPU
            for chunk, payload in enumerate(chunks):
                assert payload["y"].device == torch.device("cuda:0")  # and back on the runtime's
                expected = (torch.arange(n, dtype=torch.float32) + chunk) * 2 + 1
                assert torch.equal(payload["y"].cpu(), expected)
