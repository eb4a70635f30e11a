"""fxsym: which sizes inside a PyTorch model can change, and which must change together.

The core holds the machinery — symbols, the plugin system, the tracer, the analyzer, the
resize engine and the pass pipeline — and knows no module family by itself: every family
arrives through a plugin (``pip install fxsym-plugins-nn``).

The package is two layers of rooms that import downward only, checked by
``tests/test_layering.py``: the **kernel**, directly under ``fxsym/`` (errors, naming,
modstate, plugins, registry, symbols, tracer, analysis, resizing, paramlayout, oracles, passes),
and the pruning **workflow** on top, in :mod:`fxsym.prune` (importance, depth, planning, search,
persist, checkpoint, report_html, cli, ...). Each room's docstring ends with what it imports.
The pruning workflow: ``fxsym.importance`` scores units, ``fxsym.plan`` chooses them (a
:class:`Plan`; ``fxsym.depth`` the blocks, ``fxsym.search`` the architecture for a parameter
target), ``fxsym.save``/``fxsym.load`` write and replay it, ``fxsym.prune_checkpoint`` does it
all to a checkpoint directory, streamed. The rooms' old paths (``fxsym.checkpoint``, ...) still
import, deprecated (:mod:`fxsym._moved`).

Imports from fxsym: errors, _moved (every other public name is imported from its room on first use,
so ``import fxsym`` does not import torch and ``fxsym --help`` is instant; type checkers see
them through ``TYPE_CHECKING`` imports).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from . import _moved
from .errors import (
    AnalysisError,
    CalibrationError,
    CheckpointError,
    FxsymError,
    ImportanceWarning,
    ModelError,
    PassError,
    PassWarning,
    PlanError,
    PlanMismatchError,
    PluginError,
    PluginWarning,
    ResizeError,
    ResizeWarning,
    StaleStateError,
    TraceError,
)

_moved.install()  # the old paths of the rooms moved into fxsym.prune, deprecated

if TYPE_CHECKING:  # imported on first use at run time (see __getattr__)
    from .analysis import analyze
    from .passes import (
        ChainPattern,
        ModuleSemantics,
        OpAlias,
        Pass,
        Pattern,
        Step,
        SubgraphPattern,
        graph_pass,
        optimize,
    )
    from .plugins import PluginManager, hookimpl, load_plugins, use_plugins
    from .prune import depth, importance, search
    from .prune.checkpoint import prune_checkpoint
    from .prune.persist import load, save
    from .prune.planning import Plan, plan
    from .prune.request import PruneRequest
    from .resizing import resize
    from .symbols import SizeExpr, Symbol, SymGroup, SymInfo, SymMap
    from .tracer import TraceReport, trace

__version__ = "0.1.0"

__all__ = [
    "AnalysisError",
    "CalibrationError",
    "ChainPattern",
    "CheckpointError",
    "FxsymError",
    "ImportanceWarning",
    "ModelError",
    "ModuleSemantics",
    "OpAlias",
    "Pass",
    "PassError",
    "PassWarning",
    "Pattern",
    "Plan",
    "PlanError",
    "PlanMismatchError",
    "PluginError",
    "PluginManager",
    "PluginWarning",
    "PruneRequest",
    "ResizeError",
    "ResizeWarning",
    "SizeExpr",
    "StaleStateError",
    "Step",
    "SubgraphPattern",
    "SymGroup",
    "SymInfo",
    "SymMap",
    "Symbol",
    "TraceError",
    "TraceReport",
    "analyze",
    "depth",
    "graph_pass",
    "hookimpl",
    "importance",
    "load",
    "load_plugins",
    "optimize",
    "plan",
    "prune_checkpoint",
    "resize",
    "save",
    "search",
    "trace",
    "use_plugins",
]


#: the room each public name comes from, imported on its first use: ``import fxsym`` imports
#: the errors only, so ``fxsym --help`` starts without torch
_ROOMS = {
    "importance": "prune.importance", "depth": "prune.depth", "search": "prune.search",
    "analyze": "analysis",
    "load": "prune.persist",
    "save": "prune.persist",
    "Plan": "prune.planning", "plan": "prune.planning",
    "prune_checkpoint": "prune.checkpoint",
    "PruneRequest": "prune.request",
    "PluginManager": "plugins", "hookimpl": "plugins",
    "load_plugins": "plugins", "use_plugins": "plugins", "resize": "resizing",
    "SizeExpr": "symbols", "Symbol": "symbols", "SymGroup": "symbols", "SymInfo": "symbols",
    "SymMap": "symbols", "TraceReport": "tracer", "trace": "tracer",
    **dict.fromkeys(("optimize", "Pass", "Pattern", "ChainPattern", "Step", "SubgraphPattern",
                     "OpAlias", "ModuleSemantics", "graph_pass"), "passes"),
}


def __getattr__(name: str) -> Any:
    room = _ROOMS.get(name)
    if room is None:
        moved = _moved.moved_attribute(name)
        if moved is not None:
            return moved
        raise AttributeError(f"module 'fxsym' has no attribute {name!r}")
    module = importlib.import_module(f".{room}", __name__)
    value = module if room.rpartition(".")[2] == name else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
