"""The plugin contract of omni: pluggy project ``"omni"``, entry-point group ``omni``.

A plugin is a module (or object) with ``@hookimpl`` functions named like the specs below; it is
found through an entry point in group ``omni``. Each registration hook returns a list, so one
plugin may provide several families, engines, platforms or transports. docs/plugins.md documents
every spec here with its signature, and a test keeps the two in step.
"""

from __future__ import annotations

import pluggy

PROJECT = "omni"
ENTRY_POINT_GROUP = "omni"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def omni_families():
    """Return a list of ``FamilySpec``: the model families this plugin serves.

    A family names its tasks (speech, transcription, translation, chat), its default checkpoint id, its presets
    (``tiny`` at least: the real architecture at tiny sizes with deterministic random weights)
    and ``build(checkpoint_dir, options)``, which turns a checkpoint directory into an
    ``omni_core.pipeline.Topology``.
    """


@hookspec
def omni_engines():
    """Return a list of ``EngineSpec``: executors a stage can run on.

    A stage's ``engine`` field names one of these; ``EngineSpec.build(stage, context)`` makes the
    executor in the process that hosts the stage. The core registers ``ar`` (the paged-KV
    autoregressive engine), ``batch`` (groups requests within a window) and ``fn`` (one call per
    message) through this same hook.
    """


@hookspec
def omni_platforms():
    """Return a list of ``omni_core.platforms.Platform`` instances: hardware backends.

    A platform says whether it can run here (``is_available()`` returns ``(ok, reason)``), its
    torch device strings, device names and memory, its torch.distributed backend, whether it can
    capture graphs, the dtypes it computes in and the attention backend engines pick on it; core
    and families ask it (``omni_core.platforms.platform_for(device)``) rather than test device
    strings. The core registers ``cpu`` and ``cuda``; docs/platforms.md has the whole interface.
    """


@hookspec
def omni_transports():
    """Return a list of ``TransportSpec``: ways to move tensors between stages.

    The core registers ``inproc`` (same process, no copy), ``shm`` (shared memory), ``zmq``
    (sockets, across hosts) and ``nccl`` (GPU to GPU).
    """


@hookspec(firstresult=True)
def omni_stage_hooks(family, stage, options, hooks):
    """Return the prefill/decode hooks object for one AR stage of a family, or ``None``.

    Called once when each AR stage of every family starts (never per token), with the family's
    and the stage's names, the stage's options, and ``hooks``: the family's own hooks for the
    stage (``None`` where it has none). The first non-None answer replaces them: it may wrap
    ``hooks`` (call through to them) or stand alone. The object may define any of
    ``before_prefill``, ``post_prefill``, ``before_decode``, ``post_decode``, ``sample`` and
    ``on_finish`` (see ``omni_core.scheduler.hooks.ARHooks``); each is called once per engine
    step with batch tensors. An implementation may take any subset of the arguments.
    """
