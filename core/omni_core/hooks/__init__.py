"""The plugin contract: hook specifications, the records hooks return, and the plugin manager."""

from omni_core.hooks.errors import InputTooLarge, InvalidInput
from omni_core.hooks.hookspecs import ENTRY_POINT_GROUP, PROJECT, hookimpl, hookspec
from omni_core.hooks.manager import PluginManager, PluginRecord, UnknownNameError, get_plugin_manager
from omni_core.hooks.options import (
    PREFILL_GRAPHS_HELP,
    ar_stream_help,
    check_option_names,
    choice_option,
    engine_graph_options,
    flag_option,
    number_option,
)
from omni_core.hooks.presets import warn_random_weights
from omni_core.hooks.specs import TASKS, EngineSpec, FamilySpec, ReferenceLimits, TransportSpec, Voice

__all__ = [
    "ENTRY_POINT_GROUP",
    "PROJECT",
    "TASKS",
    "EngineSpec",
    "FamilySpec",
    "InputTooLarge",
    "InvalidInput",
    "PluginManager",
    "PluginRecord",
    "ReferenceLimits",
    "TransportSpec",
    "UnknownNameError",
    "Voice",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "check_option_names",
    "flag_option",
    "ar_stream_help",
    "choice_option",
    "engine_graph_options",
    "PREFILL_GRAPHS_HELP",
    "number_option",
    "warn_random_weights",
]
