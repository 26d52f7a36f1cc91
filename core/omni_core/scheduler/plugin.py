"""The core's engines, registered through the same hook as any plugin's."""

from __future__ import annotations

from omni_core.hooks import EngineSpec, hookimpl


def _build_fn(stage, context):
    from omni_core.scheduler.batching import FnExecutor

    return FnExecutor(stage, context)


def _build_batch(stage, context):
    from omni_core.scheduler.batching import BatchExecutor

    return BatchExecutor(stage, context)


def _build_ar(stage, context):
    from omni_core.scheduler.ar_executor import ARExecutor

    return ARExecutor(stage, context)


@hookimpl
def omni_engines():
    return [
        EngineSpec("fn", _build_fn, "one call of the stage's function per message"),
        EngineSpec("batch", _build_batch, "groups messages of concurrent requests within a window"),
        EngineSpec("ar", _build_ar, "autoregressive engine: paged KV cache, continuous batching"),
    ]
