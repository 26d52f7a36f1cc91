"""CUDA-graph capture, one at a time in a process.

Stages start and run in threads of one process. Captures use CUDA's ``thread_local`` mode, so
other threads may keep loading weights and running kernels meanwhile; but two captures at once
would race for the caching allocator's capture state. Everything in omni that captures a graph
(the AR engine's decode graphs, a family's graphs of its own) holds this lock while it does.
A platform says whether it captures graphs (``Platform.supports_graphs``); only CUDA does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch

CUDA_GRAPH_CAPTURE_LOCK = threading.RLock()


def capture_cuda_graph(step: Callable[[], Any], device: torch.device, pool: Any = None) -> tuple[torch.cuda.CUDAGraph, Any]:
    """Runs ``step`` twice (kernels and the allocator warm up outside the graph), then captures
    one call of it in a graph sharing ``pool``; returns the graph and that call's outputs."""
    with CUDA_GRAPH_CAPTURE_LOCK:
        for _ in range(2):
            step()
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        # thread_local: other stages' threads may load weights or run while this captures
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            outputs = step()
    return graph, outputs
