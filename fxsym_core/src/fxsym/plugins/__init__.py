"""The plugin system: pluggy hook specifications, the entry-point loader, the managers and
guarded hook calls.

Everything fxsym asks plugins goes through :mod:`.calls`.

Imports from fxsym: declarations, errors.
"""

from .hookspecs import hookimpl, hookspec
from .manager import (
    PluginFailure,
    PluginManager,
    active_plugins,
    default_plugin_manager,
    get_plugin_manager,
    load_plugins,
    use_plugins,
)

__all__ = [
    "PluginFailure",
    "PluginManager",
    "active_plugins",
    "default_plugin_manager",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "load_plugins",
    "use_plugins",
]
