"""The plugin system: pluggy hook specifications and the entry-point loader."""

from .hookspecs import hookimpl, hookspec
from .manager import PluginFailure, PluginManager, get_plugin_manager, load_plugins

__all__ = [
    "PluginFailure",
    "PluginManager",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "load_plugins",
]
