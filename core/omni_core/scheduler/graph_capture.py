"""One CUDA-graph capture at a time in a process.

Stages start and run in threads of one process. Captures use CUDA's ``thread_local`` mode, so
other threads may keep loading weights and running kernels meanwhile; but two captures at once
would race for the caching allocator's capture state. Everything in omni that captures a graph
(the AR engine's decode graphs, a family's graphs of its own) holds this lock while it does.
"""

from __future__ import annotations

import threading

CUDA_GRAPH_CAPTURE_LOCK = threading.RLock()
