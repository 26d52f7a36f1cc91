"""Builds one stage's executor. The in-process runtime and a spawned stage process both call
``build_executor``: there is one way to make a stage, wherever it runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omni_core.pipeline.topology import StageSpec
from omni_core.platforms import platform_for
from omni_core.scheduler.executor import Executor, Message, StageContext


def build_executor(
    stage: StageSpec,
    *,
    device: str,
    emit: Callable[[Message], None],
    fail: Callable[[str, str], None],
    plugin_manager: Any,
    family: str = "",
) -> Executor:
    """Look up the stage's engine through the plugin manager and make its executor (not started)."""
    platform = platform_for(device, plugin_manager)
    ok, reason = platform.is_available()
    if not ok:
        raise RuntimeError(f"stage {stage.name!r}: device {device!r} is not usable here: {reason}")
    context = StageContext(
        stage=stage.name,
        device=device,
        emit=emit,
        fail=fail,
        options=dict(stage.options),
        platform=platform,
        plugin_manager=plugin_manager,
        family=family,
    )
    return plugin_manager.engine(stage.engine).build(stage, context)


def release_request(executor: Executor, request_id: str) -> None:
    """Free a finished request's state: ``release`` where the executor has it, else ``abort``."""
    getattr(executor, "release", executor.abort)(request_id)
