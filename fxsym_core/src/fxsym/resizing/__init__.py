"""The resize engine: transactional, validated resizing of groups.

``fxsym.resize`` is the function; ``from fxsym.resizing import keep_entries, l1_scores,
resize_projection`` gives plugin authors the helpers (``resize_projection``: the whole resize
rule of a linear projection, ``nn.Linear`` or a transposed one). ``dim_index`` is the entries of
a dimension a choice of units keeps, and ``observe_keeps`` watches rules keep entries (both for
:mod:`fxsym.paramlayout`).

Imports from fxsym: errors, modstate, plugins, registry, symbols (room order:
``tests/test_layering.py``).
"""

from .engine import dim_index, resize
from .helpers import KeepObserver, keep_entries, l1_scores, observe_keeps, resize_projection

__all__ = ["KeepObserver", "dim_index", "keep_entries", "l1_scores", "observe_keeps", "resize",
           "resize_projection"]
