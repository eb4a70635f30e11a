"""Where the units of every group lie in the model's parameters: the :class:`ParamLayout`.

A unit of a group (a channel, an attention head) lives in many tensors: the rows its producers
write, the columns its consumers read, the scales of the norms between them, parameters used
directly in the graph. The layout says, for every parameter and dim, which slices belong to
which unit of which group; importance criteria sum over them and plans count parameters with
them.

**Derived from the analysis, in the size of the metadata.** ``analysis.symbol_dims`` gives,
for every member of a group, the segments of the dimension it sizes (``dim_index`` of
:mod:`fxsym.resizing` turns units kept into entries kept, exactly as a resize does):

* a *parameter member* (``"weight:0"``) is that dim of that parameter: its layout is read off
  the segments, nothing runs;
* a *symbol* of a module is resized by its family's rule, which the core cannot read. The rule
  runs on a copy of that one module whose parameters and buffers are meta tensors (no weight
  is read or copied), under :func:`~fxsym.resizing.observe_keeps`: every
  :func:`~fxsym.resizing.keep_entries` it makes says which entries of which parameter dim it
  keeps. Keeping subsets of units chosen so that the slices surviving spell, bit by bit, the
  unit of each slice (``⌈log2(units + 1)⌉`` calls per group of the symbol) gives the unit of
  every slice. A rule that keeps, in the first two calls, exactly the entries it is given along
  every dim it changes (a projection, a norm; no dim at all: a depthwise conv's
  ``in_channels``) needs no more calls: slice ``i`` is entry ``i``,
  whose unit the segments say; once a module has shown that, the others of its kind (class,
  rule, symbol, what they hold, sizes left out: the convs of a CNN) need one call each, which
  must keep exactly the entries given along the dims a module of the kind was shown to keep
  (else they are decoded in full). Modules whose rules and state are alike (the layers of a
  transformer) are run once: the result is reused for every module with the same class,
  symbol, segments, parameter shapes and plain attributes.

A rule that changes a parameter another way (its own ``index_select``, a new tensor) or cannot
run on meta tensors is run again on a copy of its module holding *probes* (each element its own
flat index, sized like the module's parameters) and read from the values that survive; if that
cannot tell either, :class:`~fxsym.errors.PlanError`.

:func:`fxsym.oracles.probe_layout` is the reference: trial resizes of whole-model probe
copies, with no knowledge of the analysis' segments, in ``O(copies of the model)``. The tests
compare the two on model zoos. It is an oracle and lives with the oracles;
``fxsym.paramlayout.probe_layout`` still calls it, with a ``DeprecationWarning``.

The warnings of trial runs (a plugin's "the config does not describe the resized model") are
about throw-away copies and are not shown.

One idea per module:

* :mod:`.slices` — :class:`ParamLayout` and :class:`Slices`, the layout as data, and the shapes
  and counts it gives;
* :mod:`.derive` — :func:`layout`, the direct derivation;
* :mod:`.copying`, :mod:`.signature`, :mod:`.probes` — what the derivation's trial runs need:
  one module's copies, the key of alike modules, probe tensors.

Every public name is re-exported here: ``from fxsym.paramlayout import layout``.

Imports from fxsym: errors, modstate, resizing, symbols.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from torch import nn

from ..symbols import SymMap
from .derive import layout
from .slices import LAYOUT_RENAMED, ParamLayout, Slices

__all__ = ["ParamLayout", "Slices", "layout"]


def probe_layout(model: nn.Module, symmap: SymMap) -> ParamLayout:
    """Deprecated: moved to :func:`fxsym.oracles.probe_layout` (an oracle of :func:`layout`);
    calls it, with a ``DeprecationWarning``."""
    warnings.warn("fxsym.paramlayout.probe_layout moved to fxsym.oracles.probe_layout",
                  DeprecationWarning, stacklevel=2)
    from ..oracles import probe_layout as moved  # a higher room, on this deprecated path only

    return moved(model, symmap)


if TYPE_CHECKING:
    Layout = ParamLayout  # the deprecated name (see ``__getattr__``), for old annotations
else:
    def __getattr__(name: str) -> Any:
        """``Layout``, the old name of :class:`ParamLayout`, with a ``DeprecationWarning``."""
        if name == "Layout":
            warnings.warn(LAYOUT_RENAMED, DeprecationWarning, stacklevel=2)
            return ParamLayout
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
