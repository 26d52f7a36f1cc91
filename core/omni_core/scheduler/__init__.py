"""scheduler layer of omni-core: the autoregressive engine and the stage executors.

Public API: ``AREngine``, ``EngineConfig``, ``EngineRequest``, ``SamplingParams``, ``ARHooks``,
``StepBatch``, ``AsyncAREngine`` and, for ``ar`` stages, ``ARStageWorker``. Names load lazily so
that plugin discovery (which imports ``omni_core.scheduler.plugin``) does not import torch.
"""

from importlib import import_module

_EXPORTS = {
    "AREngine": "engine",
    "EngineConfig": "engine",
    "EngineRequest": "engine",
    "GenerationOutput": "engine",
    "RequestOutput": "engine",
    "ARHooks": "hooks",
    "StepBatch": "hooks",
    "SamplingParams": "sampling_params",
    "AsyncAREngine": "async_engine",
    "RequestFailed": "async_engine",
    "ARStageWorker": "ar_stage",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'omni_core.scheduler' has no attribute {name!r}")
    return getattr(import_module(f"omni_core.scheduler.{module}"), name)
