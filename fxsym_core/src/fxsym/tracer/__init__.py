"""The tracer: torch.fx with hook-driven leaves, shape-aware proxies and robust fallback.

Imports from fxsym: errors, modstate, plugins, registry (room order:
``tests/test_layering.py``).
"""

from .api import resolve_example_inputs, trace, trace_deferred
from .deferred import DeferredGraphModule
from .guard import TRACE_LOCK, ModuleGuard
from .meta import to_meta
from .proxy import ShapeProxy, value_of
from .report import ReportEntry, TraceReport
from .shadow import original_module
from .tracer import FxsymTracer

__all__ = [
    "TRACE_LOCK",
    "DeferredGraphModule",
    "FxsymTracer",
    "ModuleGuard",
    "ReportEntry",
    "ShapeProxy",
    "TraceReport",
    "original_module",
    "resolve_example_inputs",
    "to_meta",
    "trace",
    "trace_deferred",
    "value_of",
]
