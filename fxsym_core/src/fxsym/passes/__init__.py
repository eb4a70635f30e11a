"""Graph optimization: an ordered pipeline of passes and an indexed pattern engine.

* :func:`optimize` — trace (if needed), copy, run the pipeline, verify, return a GraphModule;
* :class:`Pass` — a named ``fn(gm) -> changes`` with ``before``/``after`` constraints;
* :class:`ChainPattern` / :class:`Step` — a chain of node kinds walked back from an anchor;
* :class:`SubgraphPattern` — a pattern written as a Python function, traced once;
* :class:`OpAlias`, :class:`ModuleSemantics` — op knowledge plugins contribute;
* :func:`format_passes` — the table ``fxsym passes`` prints.

Plugins contribute all of these with the ``fxsym_register_patterns(register)`` hook.

Imports from fxsym: errors, modstate, naming, plugins, registry (and the tracer inside
:func:`optimize`; room order: ``tests/test_layering.py``).
"""

from __future__ import annotations

from ..errors import PassWarning
from .base import Pass, PassRecord, PipelineReport, graph_pass
from .catalog import PatternPass, all_passes, get_pass
from .chain import ChainPattern, Step
from .engine import PatternEngine, apply_patterns
from .listing import format_passes
from .ops import ModuleSemantics, OpAlias, get_arg
from .optimize import optimize
from .ordering import order_passes
from .pattern import Match, Pattern, RewriteContext
from .pipeline import default_pipeline, run_pipeline
from .subgraph import SubgraphPattern

__all__ = [
    "ChainPattern",
    "Match",
    "ModuleSemantics",
    "OpAlias",
    "Pass",
    "PassRecord",
    "PassWarning",
    "Pattern",
    "PatternEngine",
    "PatternPass",
    "PipelineReport",
    "RewriteContext",
    "Step",
    "SubgraphPattern",
    "all_passes",
    "apply_patterns",
    "default_pipeline",
    "format_passes",
    "get_arg",
    "get_pass",
    "graph_pass",
    "optimize",
    "order_passes",
    "run_pipeline",
]
