"""The garbage collector during a long run: the objects alive before it are not scanned.

A full (generation-2) collection scans every tracked object of the process. After the imports
of a transformers model (torch, transformers, the modeling module) a process holds some 440k of
them, and a full collection costs 0.6-1.0 s of CPU on a 2-core machine; the objects a prune
creates (traces, meta models, plans) trigger one or more, where a plain ``from_pretrained``
and forward trigger none. The analysis pauses the collector while it runs
(:func:`fxsym.tracer.guard.gc_paused`); what it left alive triggers that collection soon
after, in the prune's next step. Those old objects are the caller's and the libraries': a run
neither frees nor creates cycles among them, so scanning them finds nothing.

:func:`old_objects_frozen` moves them out of the collector's sight for the run
(:func:`gc.freeze`) and back at its end (:func:`gc.unfreeze`); what the run creates is
collected as before. A process that has frozen objects of its own (``gc.get_freeze_count()``
above 0, say a server frozen before it forks) is left as it is: unfreezing at the end would
undo its freeze.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def old_objects_frozen() -> Iterator[None]:
    """Inside, the collector scans only the objects created inside (see the module)."""
    if gc.get_freeze_count() or not gc.isenabled():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
