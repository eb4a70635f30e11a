"""How much a plan removes, checked: exactly one amount, each a finite number in its range
(:func:`_check_amounts`), sizes given group by group within each group (:func:`_given_sizes`),
and the error of a target no allowed plan reaches (:func:`_unreachable`).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import PlanError
from ...symbols import SymGroup
from ..options import check_amount_values
from .units import _Candidate


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_amounts(ratio: Any, target_params: Any, target_macs: Any,
                   target_non_embedding_params: Any) -> None:
    """Exactly one amount, each a finite number in its range (a NaN compares false with
    everything: unchecked, a bisection on it ends at the smallest model)."""
    given = [x for x in (ratio, target_params, target_macs, target_non_embedding_params)
             if x is not None]
    if len(given) != 1:
        raise PlanError("give exactly one of ratio, target_params, target_non_embedding_params "
                        "and target_macs")
    check_amount_values(ratio=ratio, target_params=target_params, target_macs=target_macs,
                        target_non_embedding_params=target_non_embedding_params)


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
