from __future__ import annotations

from omni_core.platforms.base import Platform


class PlatformUnavailableError(RuntimeError):
    pass


def resolve_platform(name: str = "auto", manager=None) -> Platform:
    """``auto`` picks the available platform with the highest priority; a named one must be available."""
    if manager is None:
        from omni_core.hooks import get_plugin_manager

        manager = get_plugin_manager()
    platforms = manager.platforms()
    if name == "auto":
        usable = [p for p in platforms.values() if p.is_available()[0]]
        return max(usable, key=lambda p: p.priority)
    platform = manager.platform(name)
    ok, reason = platform.is_available()
    if not ok:
        raise PlatformUnavailableError(f"platform {name!r} is not available: {reason}")
    return platform
