"""omni hook implementations: the ``xpu`` platform."""

from __future__ import annotations

from omni_core.hooks import hookimpl


@hookimpl
def omni_platforms():
    from .platform import XpuPlatform

    return [XpuPlatform()]
