"""Plugin discovery, validation and listing.

Plugins come from entry points in group ``omni``; omni-core registers its own built-ins (cpu and
cuda platforms, transports, engines) through the same group. A plugin that fails to import, names
an unknown hook, or raises or returns the wrong type from a registration hook is kept out and
listed with status "error"; everything else still works.

``OMNI_PLUGINS`` selects third-party plugins by entry-point name (comma list; empty = none;
unset = all). Built-ins of omni-core always load.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import pluggy

from omni_core.hooks import hookspecs
from omni_core.hooks.specs import EngineSpec, FamilySpec, TransportSpec

CORE_DIST = "omni-core"

# registration hook -> (key in "provides", record type or None for duck-typed platforms)
REGISTRATIONS: dict[str, tuple[str, type | None]] = {
    "omni_families": ("families", FamilySpec),
    "omni_engines": ("engines", EngineSpec),
    "omni_platforms": ("platforms", None),
    "omni_transports": ("transports", TransportSpec),
}


class UnknownNameError(LookupError):
    """A family, engine, platform or transport that no loaded plugin provides."""


@dataclass
class PluginRecord:
    """One plugin as discovery found it (``omni plugins list`` prints these; ``--json`` gives
    ``to_json``): its entry-point ``name``, the distribution ``dist`` and ``version`` that ship it,
    ``status`` ``"ok"`` or ``"error"`` (then ``error`` holds why it did not load: an import error
    or a hook that raised, and the rest of the plugins load regardless), the ``hooks`` it
    implements, and ``provided``: per registration (``"families"``, ``"engines"``,
    ``"platforms"``, ``"transports"``) the records its hooks returned."""

    name: str
    dist: str
    version: str
    status: str = "ok"
    error: str | None = None
    hooks: list[str] = field(default_factory=list)
    provided: dict[str, list[Any]] = field(default_factory=dict)

    def provides(self) -> dict[str, list[str]]:
        return {key: [item.name for item in self.provided.get(key, [])] for key, _ in REGISTRATIONS.values()}

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dist": self.dist,
            "version": self.version,
            "provides": self.provides(),
            "hooks": self.hooks,
            "status": self.status,
            "error": self.error,
        }


def _selection() -> set[str] | None:
    raw = os.environ.get("OMNI_PLUGINS")
    if raw is None:
        return None
    return {name.strip() for name in raw.split(",") if name.strip()}


class PluginManager:
    """Loads every plugin once and answers lookups by name."""

    def __init__(self, entry_points: list[metadata.EntryPoint] | None = None, selection: set[str] | None = ...):
        self.pm = pluggy.PluginManager(hookspecs.PROJECT)
        self.pm.add_hookspecs(hookspecs)
        self.records: list[PluginRecord] = []
        if entry_points is None:
            entry_points = list(metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP))
        selected = _selection() if selection is ... else selection
        for ep in sorted(entry_points, key=lambda e: (_dist_name(e) != CORE_DIST, e.name)):
            dist = _dist_name(ep)
            if dist != CORE_DIST and selected is not None and ep.name not in selected:
                continue
            self.records.append(self._load(ep, dist))

    def register_object(self, name: str, plugin: object, dist: str = "local", version: str = "0") -> PluginRecord:
        """Register an already-imported plugin object (tests, embedding applications)."""
        record = PluginRecord(name=name, dist=dist, version=version)
        self._validate_and_collect(record, plugin)
        self.records.append(record)
        return record

    def _load(self, ep: metadata.EntryPoint, dist: str) -> PluginRecord:
        version = ep.dist.version if ep.dist is not None else "unknown"
        record = PluginRecord(name=ep.name, dist=dist, version=version)
        try:
            plugin = ep.load()
        except BaseException as exc:  # a plugin's import may raise anything, even SystemExit
            if isinstance(exc, KeyboardInterrupt):
                raise
            record.status, record.error = "error", f"import failed: {type(exc).__name__}: {exc}"
            return record
        self._validate_and_collect(record, plugin)
        return record

    def _validate_and_collect(self, record: PluginRecord, plugin: object) -> None:
        try:
            self.pm.register(plugin, name=f"{record.dist}:{record.name}")
        except (pluggy.PluginValidationError, ValueError) as exc:
            record.status, record.error = "error", f"invalid plugin: {exc}"
            return
        known = set(REGISTRATIONS) | {"omni_stage_hooks"}
        record.hooks = sorted(caller.name for caller in (self.pm.get_hookcallers(plugin) or []))
        unknown = [name for name in _declared_hook_names(plugin) if name not in known]
        if unknown:
            self.pm.unregister(plugin)
            record.status, record.error = "error", f"unknown hook(s): {', '.join(unknown)}"
            return
        try:
            for hook_name, (key, expected) in REGISTRATIONS.items():
                impl = getattr(plugin, hook_name, None)
                if impl is None or hook_name not in record.hooks:
                    continue
                items = impl()
                if items is None:
                    items = []
                if not isinstance(items, (list, tuple)):
                    raise TypeError(f"{hook_name} must return a list, got {type(items).__name__}")
                for item in items:
                    if expected is not None and not isinstance(item, expected):
                        raise TypeError(f"{hook_name} returned {type(item).__name__}, expected {expected.__name__}")
                    if not isinstance(getattr(item, "name", None), str):
                        raise TypeError(f"{hook_name} returned an item without a string name")
                record.provided[key] = list(items)
        except Exception as exc:
            self.pm.unregister(plugin)
            record.provided = {}
            record.status, record.error = "error", f"{type(exc).__name__}: {exc}"

    # -- lookups ---------------------------------------------------------------------------------

    def _all(self, key: str) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for record in self.records:
            if record.status != "ok":
                continue
            for item in record.provided.get(key, []):
                found.setdefault(item.name, item)  # built-ins load first and keep their names
        return found

    def families(self) -> dict[str, FamilySpec]:
        return self._all("families")

    def engines(self) -> dict[str, EngineSpec]:
        return self._all("engines")

    def platforms(self) -> dict[str, Any]:
        return self._all("platforms")

    def transports(self) -> dict[str, TransportSpec]:
        return self._all("transports")

    def _one(self, key: str, what: str, name: str) -> Any:
        items = self._all(key)
        if name not in items:
            installed = ", ".join(sorted(items)) or "none"
            raise UnknownNameError(f"unknown {what} {name!r}; installed: {installed}")
        return items[name]

    def family(self, name: str) -> FamilySpec:
        return self._one("families", "family", name)

    def engine(self, name: str) -> EngineSpec:
        return self._one("engines", "engine", name)

    def platform(self, name: str) -> Any:
        return self._one("platforms", "platform", name)

    def transport(self, name: str) -> TransportSpec:
        return self._one("transports", "transport", name)

    def stage_hooks(self, family: str, stage: str, options: dict[str, Any], hooks: Any = None) -> Any:
        """What a plugin puts in place of ``hooks`` (the family's own) for this AR stage, or None."""
        return self.pm.hook.omni_stage_hooks(family=family, stage=stage, options=options, hooks=hooks)


def _dist_name(ep: metadata.EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "unknown"


def _declared_hook_names(plugin: object) -> list[str]:
    """Names of the functions the plugin marked with ``@hookimpl``."""
    marker = f"{hookspecs.PROJECT}_impl"
    return [attr for attr in dir(plugin) if hasattr(getattr(plugin, attr, None), marker)]


_MANAGER: PluginManager | None = None


def get_plugin_manager(reload: bool = False) -> PluginManager:
    """The process-wide plugin manager, loaded on first use."""
    global _MANAGER
    if _MANAGER is None or reload:
        _MANAGER = PluginManager()
    return _MANAGER
