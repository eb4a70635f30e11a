"""Which units a plan may drop, by importance: the scores of a criterion (its name, a callable or
scores given directly) checked against the groups and for finite values, each candidate
group with its scores (:class:`_Candidate`), the order of every unit over all groups for a
global plan (scores divided by their group's mean) and the classes of groups tied by
``same_size``, which keep as many units as each other.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ...errors import PlanError
from ...paramlayout import ParamLayout
from ...symbols import SymGroup, SymMap
from ..importance import CRITERIA, criterion_by_name


@dataclass
class _Candidate:
    group: SymGroup
    scores: torch.Tensor


def _criterion_scores(model: nn.Module, symmap: SymMap, importance: Any,
                      groups: Sequence[SymGroup]) -> tuple[str, Mapping[str, Any]]:
    """The label and the scores of ``importance``: a criterion's name, a criterion, or
    scores given directly (every key a group)."""
    if isinstance(importance, str):
        label, scores = importance, criterion_by_name(importance)(model, symmap)
    elif callable(importance):
        label = getattr(importance, "__name__", "custom")
        scores = importance(model, symmap)
    elif isinstance(importance, Mapping):
        label, scores = "given", dict(importance)
    else:
        raise PlanError(f"importance must be a criterion's name ({', '.join(CRITERIA)}), a "
                        f"criterion or {{group name: scores}}; got a {type(importance).__name__}")
    if not isinstance(scores, Mapping):
        raise PlanError(f"the {label} importance returned a {type(scores).__name__}, not "
                        "{group name: scores}")
    names = {g.name for g in groups}
    unknown = [k for k in scores if k not in names]
    if unknown:
        near = difflib.get_close_matches(str(unknown[0]), list(names), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise PlanError(f"the {label} importance scores {unknown[0]!r}, which is not a group "
                        f"of the model{hint}")
    return label, scores


def _check_finite(model: nn.Module, lay: ParamLayout, group: SymGroup, scores: torch.Tensor,
                  label: str) -> None:
    """A NaN or infinite score would rank its unit arbitrarily (NaN compares false with
    everything; inf also makes the group's mean infinite): refuse it, naming the units and
    the parameters holding non-finite values there."""
    bad = (~torch.isfinite(scores)).nonzero().flatten()
    if not bad.numel():
        return
    units = f"unit {int(bad[0])}" + (f" (and {bad.numel() - 1} more)" if bad.numel() > 1 else "")
    params = dict(model.named_parameters())
    holders = []
    for s in lay.slices.get(group.name, ()):
        p = params.get(s.param)
        if p is None or p.device.type == "meta" or s.param in holders:
            continue
        rows = s.index[torch.isin(s.unit, bad)]
        if rows.numel() and not torch.isfinite(p.detach().index_select(s.dim, rows)).all():
            holders.append(s.param)
    verb = "holds" if len(holders) == 1 else "hold"
    where = f": {', '.join(holders)} {verb} NaN or inf there" if holders else ""
    raise PlanError(f"the {label} importance of group {group.name!r} is NaN or infinite for "
                    f"{units}{where}; repair the weights, leave the group whole "
                    f"(exclude={group.name!r}) or give finite scores")


def _global_order(candidates: Sequence[_Candidate]) -> torch.Tensor:
    """The position in ``candidates`` of each unit's group, one per unit, lowest score first
    (scores divided by their group's mean); equal scores by unit index, then group name."""
    if not candidates:
        return torch.zeros(0, dtype=torch.long)
    by_name = sorted(range(len(candidates)), key=lambda j: candidates[j].group.name)
    name_rank = torch.empty(len(candidates), dtype=torch.long)
    name_rank[torch.tensor(by_name)] = torch.arange(len(candidates))
    values, units, owners = [], [], []
    for j, c in enumerate(candidates):
        mean = float(c.scores.mean())
        values.append(c.scores / mean if mean > 0 else c.scores)
        units.append(torch.arange(c.scores.numel()))
        owners.append(torch.full((c.scores.numel(),), j, dtype=torch.long))
    value, unit, owner = torch.cat(values), torch.cat(units), torch.cat(owners)
    order = torch.argsort(name_rank.index_select(0, owner), stable=True)
    for key in (unit, value):  # least significant first: stable sorts keep the earlier keys
        order = order.index_select(0, torch.argsort(key.index_select(0, order), stable=True))
    return owner.index_select(0, order)


def _same_size_classes(groups: Sequence[SymGroup]) -> list[list[str]]:
    classes: list[set[str]] = []
    for g in groups:
        tied = set(getattr(g, "same_size", ())) | {g.name}
        if len(tied) == 1:
            continue
        joined = [c for c in classes if c & tied]
        for c in joined:
            classes.remove(c)
            tied |= c
        classes.append(tied)
    return [sorted(c) for c in classes]
