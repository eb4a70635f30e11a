"""The search's shortlist: candidates ranked by a damage estimate from the calibration pass,
so that only the best few are scored by their loss (issue 31 §4).

Scoring a candidate by its loss runs the calibration tokens through it, which is the search's
cost; the calibration pass already made says, for free, how much of each block's update and of
the residual stream a candidate keeps. :func:`damage` turns that into one number, in the unit
of ShortGPT's block importance (``1 - cos`` of the residual stream before and after a change):

* a block the candidate drops: its block importance ``b`` (the stream loses that update);
* a block it keeps, whose width groups it cuts (an FFN width, heads, an expert FFN: the groups
  whose members all lie in that block): ``b * (1 - sqrt(f))**2``, ``f`` the share of the
  squared importance scores of those groups' units that it keeps (their product over the
  groups). The update keeps about ``sqrt(f)`` of its norm, and ``1 - cos`` grows with the
  square of the angle an update turns the stream by;
* the hidden size and every other group outside the blocks (the residual stream's features,
  read by every block it keeps and by the output): ``(kept blocks + 1) * (1 - sqrt(f))``, the
  ``1 - cos`` between the stream and the stream with those features gone, once for every
  read.

Without block scores every block counts 1. No weight of one term against another is fitted:
each is what the calibration measured, in one unit. On SmolLM2-135M (real weights, 512
calibration tokens) the lowest damage is the lowest loss at 25 % and 50 % of the non-embedding
parameters removed (``docs/pruning.md``); it is an estimate, which is why the shortlist is then
scored in full, and why the table says which candidates only the estimate ranked.

Imports from fxsym: errors, importance, planning, request, symbols.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ..errors import PlanError
from ..symbols import SymMap
from .importance import unit_scores
from .planning import Plan
from .request import SHORTLIST

__all__ = ["SHORTLIST", "check_shortlist", "damage", "shortlist"]



def check_shortlist(size: Any) -> None:
    """A :class:`~fxsym.errors.PlanError` unless ``size`` is a number of candidates (1 or
    more) or ``None`` (all of them)."""
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
        raise PlanError(f"shortlist={size!r}: give how many candidates to score by their loss "
                        "(1 or more), or None to score them all")


def damage(symmap: SymMap, chosen: Plan, scores: Mapping[str, Any],
           block_scores: Mapping[str, Any]) -> float:
    """The damage estimate of ``chosen`` (see the module docstring): ``scores`` are the units'
    importance (``{group: one score per unit}``, those the plan was made from),
    ``block_scores`` each depth group's block importance."""
    depth = {d.name: d for d in symmap.depth_groups()}
    homes: dict[str, tuple[str, int]] = {}  # block qualname -> (depth group, position)
    for d in depth.values():
        homes.update({b: (d.name, i) for i, b in enumerate(d.blocks)})
    kept = {d.name: set(d.keep) for d in chosen.depth}
    importance = {name: _block_scores(block_scores.get(name), d.size)
                  for name, d in depth.items()}
    in_block: dict[tuple[str, int], float] = {}  # the share kept of each block's units
    stream = 1.0
    groups = {g.name: g for g in symmap.groups()}
    for choice in chosen.groups:
        g = groups.get(choice.name)
        if choice.keep is None or g is None:
            continue
        s = unit_scores(g, scores)
        if s is None:
            continue
        energy = s.square()
        total = float(energy.sum())
        share = float(energy[list(choice.keep)].sum()) / total if total > 0 else 1.0
        home = _home(g.members, homes)
        if home is None:
            stream *= share
        else:
            in_block[home] = in_block.get(home, 1.0) * share
    out = 0.0
    reads = 1
    for name, d in depth.items():
        keep = kept.get(name, set(range(d.size)))
        reads += len(keep)
        for i, b in enumerate(importance[name]):
            out += b if i not in keep else b * (1 - math.sqrt(in_block.get((name, i), 1.0))) ** 2
    return out + reads * (1 - math.sqrt(stream))


def shortlist(damages: Sequence[float], size: int | None) -> list[int]:
    """The positions of the ``size`` lowest ``damages`` (all of them for ``None``), in the
    order given; ties broken by position."""
    if size is None or size >= len(damages):
        return list(range(len(damages)))
    ranked = sorted(range(len(damages)), key=lambda i: (damages[i], i))
    return sorted(ranked[:size])


def _block_scores(scores: Any, n: int) -> list[float]:
    if scores is None:
        return [1.0] * n
    values = torch.as_tensor(scores, dtype=torch.float64).flatten().tolist()
    return [float(v) for v in values] if len(values) == n else [1.0] * n


def _home(members: Sequence[tuple[str, str]], homes: Mapping[str, tuple[str, int]]
          ) -> tuple[str, int] | None:
    """The block every member lies in (a member is a module qualname), or ``None``."""
    found = set()
    for q, _ in members:
        block = next((homes[p] for p in _prefixes(q) if p in homes), None)
        if block is None:
            return None
        found.add(block)
    return found.pop() if len(found) == 1 else None


def _prefixes(qualname: str) -> list[str]:
    parts = qualname.split(".")
    return [".".join(parts[:k]) for k in range(len(parts), 0, -1)]
