"""Symbols: the resizable (or fixed) sizes of one module, and the map of them over a model.

A :class:`Symbol` is one size of one module, e.g. ``out_channels`` of a conv. It is in exactly
one of four states:

* *free*: nothing decided yet (the state before analysis);
* *searchable*: the root of a cross-layer group, its value may be chosen;
* *dynamic*: linked to a parent symbol whose value it follows;
* *constant*: its value cannot change.

Cross-layer symbols say which dimension of the module's input (``INCOMING``) or output
(``OUTGOING``) tensor they size, through ``elastic_dims`` (several equivalent spellings of one
dimension, e.g. ``{1, -3}`` for the channels of NCHW).

A :class:`SymInfo` holds the symbols of one module, and may declare which of the module's int
attributes derive from them (:class:`SizeExpr`: ``num_heads = heads``). A :class:`SymMap` holds
the SymInfos of a model's modules and, after :func:`fxsym.analyze`, what the analysis found (a
:class:`GroupAnalysis`), whose searchable groups it offers as :class:`SymGroup`.

One idea per module, each importing only those before it:

* :mod:`.symbol` — :class:`Symbol` and its states;
* :mod:`.syminfo` — :class:`SymInfo`, :class:`SizeExpr`;
* :mod:`.attributes` — attribute members (``"attr:name"``), read and written by name;
* :mod:`.groups` — :class:`SymGroup`, :class:`DepthGroup`, :class:`GroupAnalysis` and the
  protocols :class:`Segment` and :class:`GroupIndex`;
* :mod:`.symmap` — :class:`SymMap`.

Every name is re-exported here: ``from fxsym.symbols import SymMap`` is the way to import it.

This room names no higher room but for :attr:`SymMap.trace_report` (an empty
``TraceReport`` until :func:`fxsym.analyze` sets one; plain data): what it needs of the
analysis' dimension segments and group table is spelled as the protocols :class:`Segment` and
:class:`GroupIndex`.

Imports from fxsym: nothing (the registry and the tracer's ``TraceReport`` inside functions).
"""

from __future__ import annotations

from .attributes import ATTRIBUTE_PREFIX, attribute_value, set_attribute
from .groups import (
    DepthGroup,
    GroupAnalysis,
    GroupIndex,
    Segment,
    SymbolKey,
    SymGroup,
    combine_step,
)
from .symbol import Symbol
from .syminfo import SizeExpr, SymInfo, SymInfoFactory
from .symmap import SymMap

__all__ = [
    "ATTRIBUTE_PREFIX",
    "DepthGroup",
    "GroupAnalysis",
    "GroupIndex",
    "Segment",
    "SizeExpr",
    "SymGroup",
    "SymInfo",
    "SymInfoFactory",
    "SymMap",
    "Symbol",
    "SymbolKey",
    "attribute_value",
    "combine_step",
    "set_attribute",
]
