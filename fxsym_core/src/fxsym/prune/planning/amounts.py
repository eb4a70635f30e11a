"""How much a plan removes, checked against the model: sizes given group by group within each
group (:func:`_given_sizes`), and the error of a target no allowed plan reaches
(:func:`_unreachable`). Which amounts go together, and their ranges, are the request's rules
(:meth:`fxsym.prune.request.PruneRequest.check`).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import PlanError
from ...symbols import SymGroup
from .units import _Candidate


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _unreachable(what: str, target: int, least: int) -> str:
    return (f"cannot reach {target} {what}: the smallest plan allowed (min_keep, round_to, "
            f"exclude, the groups the criterion scores) has {least}")


def _given_sizes(sizes: Mapping[str, int], groups: Sequence[SymGroup],
                 candidates: Sequence[_Candidate]) -> dict[str, int]:
    """``sizes`` checked (groups of the model, counts in range) over every candidate."""
    known = {g.name: g for g in groups}
    ranked = {c.group.name for c in candidates}
    for name, n in sizes.items():
        g = known.get(name)
        if g is None:
            raise PlanError(f"sizes names {name!r}, which is not a group of the model")
        if not _is_int(n) or not 1 <= n <= g.size:
            raise PlanError(f"sizes: {name!r} has {g.size} units; keep 1 to {g.size}, not {n!r}")
        if n < g.size and name not in ranked:
            raise PlanError(f"sizes: {name!r} cannot shrink here (excluded, too small for "
                            "min_keep, or the criterion cannot score it)")
    return {c.group.name: int(sizes.get(c.group.name, c.group.size)) for c in candidates}
