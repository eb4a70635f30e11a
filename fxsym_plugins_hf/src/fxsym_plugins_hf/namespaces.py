"""Functions of transformers replaced, for one trace, wherever transformers holds them.

transformers' models import their helpers by name (``from ...masking_utils import
create_causal_mask``), so a helper is replaced in every ``transformers.*`` module whose
namespace holds that very function object, and put back afterwards even when the trace
raises. :mod:`.masks` (the mask builders as graph leaves) and :mod:`.checks` (value checks
a trace cannot decide) use it.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any


@contextmanager
def replaced(wrappers: Mapping[Callable[..., Any], Callable[..., Any]]) -> Iterator[None]:
    """Replace each key of ``wrappers`` by its value in every ``transformers.*`` module
    namespace holding it; always restore."""
    by_id = {id(fn): (fn, wrapper) for fn, wrapper in wrappers.items()}
    saved: list[tuple[Any, str, Any]] = []
    try:
        for modname, mod in list(sys.modules.items()):
            if mod is None or modname.partition(".")[0] != "transformers":
                continue
            space = getattr(mod, "__dict__", None)
            if not space:
                continue
            for attr, value in list(space.items()):
                found = by_id.get(id(value))
                if found is not None and value is found[0]:
                    saved.append((mod, attr, value))
                    setattr(mod, attr, found[1])
        yield
    finally:
        for mod, attr, value in reversed(saved):
            setattr(mod, attr, value)
