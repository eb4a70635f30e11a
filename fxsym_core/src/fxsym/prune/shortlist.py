"""The search's shortlist: candidates ranked by a damage estimate from the calibration pass,
so that only the best few are scored by their loss (issue 31 §4).

Scoring a candidate by its loss runs the calibration tokens through it, which is the search's
cost; the calibration pass already made says, for free, how much each block turns the
residual stream and how much of each group's activation a cut keeps. :func:`damage` turns
that into one number, in the unit of ShortGPT's block importance ``b`` (``1 - cos`` of a
block's input and output hidden states: for a small turn, the squared size of the block's
update relative to the stream, halved). Each term is a change the candidate makes to the
stream, priced in that unit:

* a block the candidate drops: the stream loses its whole update, ``b``;
* a block it keeps changes its update; a change of a relative size ``r`` turns the stream by
  ``r`` times the angle the update turns it by, so it costs ``b * r**2``. Two changes, whose
  squares add:

  - its cut widths (an FFN width, heads, an expert FFN: the groups whose members all lie in
    that block). ``f`` is the share of the squared importance scores of those groups' units
    that the candidate keeps (their product over the groups): the update keeps about
    ``sqrt(f)`` of its norm, ``r = 1 - sqrt(f)``;
  - the hidden size and every other group outside the blocks, which the block reads: its input
    loses the channels cut, which are orthogonal to those kept, so the input changes by the
    share of its energy removed, ``r**2 = 1 - f_stream`` (``f_stream`` the share of the
    squared scores kept, the product over those groups). The first-order change of the
    update is the same share;
* the stream itself, projected on the channels kept, once: the output reads it turned by
  ``1 - cos = 1 - sqrt(f_stream)``.

Without block scores every block counts 1. No weight of one term against another is fitted:
each is what the calibration measured, in one unit. Before (issue 31 §4, efb309f) the hidden
size was charged ``1 - sqrt(f_stream)`` once for every read of the stream, whatever the block:
the projection, the same at every read, was counted ``kept blocks + 1`` times, which made
cutting 72 of SmolLM2's 576 channels cost as much as dropping its 20 least influential blocks.
The full search's winner's rank under both, on searches other than those the estimate was
derived on, is in ``docs/pruning.md`` (``benchmarks/shortlist_terms.py``): in the 4 lowest up to
55 % of SmolLM2's non-embedding parameters removed, 5th at 62.5 % and 8th at 70 %, where deep
width cuts cost more than a first-order term in the share kept says. It is an estimate, which is
why the shortlist is then scored by its loss, and why the table says which candidates only the
estimate ranked.

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
    read = 1 - stream  # the share of every block's input the cut channels held
    out = 0.0
    for name, d in depth.items():
        keep = kept.get(name, set(range(d.size)))
        for i, b in enumerate(importance[name]):
            if i not in keep:
                out += b
            else:
                out += b * ((1 - math.sqrt(in_block.get((name, i), 1.0))) ** 2 + read)
    return out + 1 - math.sqrt(stream)


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
