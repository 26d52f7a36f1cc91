"""Which platform a ``--device`` names, and which platform owns a device a stage runs on."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from omni_core.platforms.base import Platform


class PlatformUnavailableError(RuntimeError):
    pass


def _manager(manager: Any) -> Any:
    if manager is None:
        from omni_core.hooks import get_plugin_manager

        manager = get_plugin_manager()
    return manager


def auto_order(platforms: Iterable[Platform]) -> list[Platform]:
    """The order in which ``--device auto`` tries platforms: highest priority first."""
    return sorted(platforms, key=lambda p: p.priority, reverse=True)


def resolve_platform(name: str = "auto", manager: Any = None) -> Platform:
    """``auto`` picks the first available platform of ``auto_order``; a named one (``xpu``, or a
    device of it such as ``cuda:1``) must be installed, available and have that device."""
    from omni_core.hooks import UnknownNameError

    manager = _manager(manager)
    if name == "auto":
        for platform in auto_order(manager.platforms().values()):
            if platform.is_available()[0]:
                return platform
        raise PlatformUnavailableError("no installed platform is available")
    platform_name, _, index = name.partition(":")
    try:
        platform = manager.platform(platform_name)
    except UnknownNameError as exc:
        # core names no backend: where to get one is the platforms page's to say
        raise UnknownNameError(f"{exc}; platforms come in plugin packages (docs/platforms.md lists them)") from None
    ok, reason = platform.is_available()
    if not ok:
        raise PlatformUnavailableError(f"platform {platform_name!r} is not available: {reason}")
    if index:
        count = platform.device_count()
        if not index.isdigit() or int(index) >= count:
            raise PlatformUnavailableError(f"no device {name!r}: {platform_name} has {count} here ({platform_name}:0 to {platform_name}:{count - 1})")
    return platform


# a process's platforms by device type: stages and the helpers they call agree on one
_BY_DEVICE_TYPE: dict[str, Platform] = {}
_UNCLAIMED = Platform()  # a device type no platform claims (torch's meta): work runs in order


def platform_for(device: Any, manager: Any = None) -> Platform:
    """The platform whose ``device_type`` is ``device``'s ("cpu", "xpu:1", a torch.device). With
    no ``manager``, the one this process already found for that type, else the process's
    plugin manager's; a type no platform claims gets the defaults of ``Platform``."""
    device_type = getattr(device, "type", None) or str(device).split(":", 1)[0]
    if manager is None and device_type in _BY_DEVICE_TYPE:
        return _BY_DEVICE_TYPE[device_type]
    for platform in _manager(manager).platforms().values():
        if platform.device_type == device_type:
            _BY_DEVICE_TYPE[device_type] = platform
            return platform
    return _UNCLAIMED
