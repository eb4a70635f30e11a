"""The groups a plan keeps whole by name: ``exclude``'s names or ``fnmatch`` patterns, each
matching a group of the model (a pattern matching none is a
:class:`~fxsym.errors.PlanError`, with the closest names).
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Sequence
from typing import Any

from ...errors import PlanError
from ...symbols import SymGroup, SymMap


def excluded_groups(symmap: SymMap, exclude: str | Iterable[str]) -> frozenset[str]:
    """The names of the groups of ``symmap`` that ``exclude`` keeps whole (:func:`plan`'s
    ``exclude``: names or ``fnmatch`` patterns, one string is one pattern; a pattern matching
    no group is a :class:`~fxsym.errors.PlanError`)."""
    groups = symmap.groups()
    patterns = _exclude_patterns(exclude, groups)
    return frozenset(g.name for g in groups
                     if any(fnmatch.fnmatchcase(g.name, p) for p in patterns))


def _exclude_patterns(exclude: Any, groups: Sequence[SymGroup]) -> list[str]:
    """``exclude`` as a list of patterns (one string is one pattern), each matching a group."""
    patterns = [exclude] if isinstance(exclude, str) else exclude
    try:
        patterns = list(patterns)
    except TypeError:
        raise PlanError(f"exclude must be a group name or pattern, or a list of them; got "
                        f"{exclude!r}") from None
    names = [g.name for g in groups]
    for p in patterns:
        if not isinstance(p, str):
            raise PlanError(f"exclude holds {p!r}, not a group name or pattern")
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            near = difflib.get_close_matches(p, names, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else \
                " (sizes that are not searchable groups are never pruned)"
            raise PlanError(f"exclude pattern {p!r} matches no group{hint}")
    return patterns
