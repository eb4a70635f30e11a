"""The search's space of *uniform* candidates for a parameter target (:func:`candidates`).

Every group of a role keeps the same size: a few depths (all blocks, then 7/8, 3/4, 5/8 and
1/2 of them: :data:`FRACTIONS`) times a few sizes of the stream role (the same fractions,
rounded down to a multiple of ``round_to``), each with the widest widths of the width roles
that meet the target (one fraction for every width class, each class's width that fraction of
its own, rounded down to its step and ``round_to``: :func:`_widest`); the counts stay whole. A
candidate lands as close under the target as the steps allow (one further under is not
offered); a target above the model's (active) parameters is an error. The candidates are
counted from the parameters' metadata (:func:`counter`, on a meta model too), never built.
*Non-embedding* parameters (``non_embedding=True``) are every parameter but the embedding
tables (tied to the head or not: :func:`fxsym.prune.embeddings.embedding_tables`), the count
model cards quote; *active* ones are :mod:`.active`'s.

Imports from fxsym: depth, embeddings, errors, planning, roles, symbols.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import nn

from ...errors import PlanError
from ...symbols import SymMap
from ..depth import renamed, usable_blocks
from ..embeddings import embedding_tables
from ..planning import described, excluded_groups, param_shapes
from ..roles import RoleKind, Roles, group_sources, roles
from .active import picked_shares
from .results import Candidate, counted
from .sizes import put_sizes

#: the fractions of blocks and of the hidden size the search tries
FRACTIONS = (1.0, 0.875, 0.75, 0.625, 0.5)


@dataclass(frozen=True)
class _Range:
    """What the search may give one width class: its width now, the step of entries every
    group of it takes at a time, and the fewest entries it keeps."""

    now: int
    step: int
    least: int


def _ranges(symmap: SymMap, r: Roles, kept: frozenset[str], whole: Mapping[str, str],
            step: Mapping[str, int], round_to: int, min_keep: int) -> dict[str, _Range]:
    """The range of each width class the search sizes (``{label: range}``): one with no
    group left to it (every group excluded) or with a group the model's description cannot
    follow is kept. Classes of different roles as wide and read from a common source (a
    config field changing both: DeepSeek's ``moe_intermediate_size`` sizes its experts and
    its shared experts) share one range, the steps of both, so every candidate gives them
    one width and the field can still describe them."""
    groups = {g.name: g for g in symmap.groups()}
    sources = group_sources(symmap)
    out: dict[str, _Range] = {}
    fields: dict[str, set[str]] = {}
    for label, names in r.classes:
        own = [groups[n] for n in names if n not in kept]
        if not own or whole.keys() & set(names):
            continue
        unit = math.lcm(*(step[g.name] for g in own))
        out[label] = _Range(
            max(g.size * g.unit for g in own),
            math.lcm(round_to, unit) if round_to % unit == 0 or unit % round_to == 0 else unit,
            max(min_keep * g.unit for g in own))
        fields[label] = {f for g in own for f in sources.get(g.name, "").split("+") if f}
    for label in out:
        tied = [k for k in out if out[k].now == out[label].now and fields[k] & fields[label]]
        if len(tied) > 1:
            one = _Range(out[label].now, math.lcm(*(out[k].step for k in tied)),
                         max(out[k].least for k in tied))
            out.update(dict.fromkeys(tied, one))
    return out


def candidates(model: nn.Module, symmap: SymMap, *, target_params: int,
               active: bool = False, non_embedding: bool = False, round_to: int = 64,
               block_scores: Mapping[str, Any] | None = None,
               fractions: Sequence[float] = FRACTIONS,
               depths: Sequence[int] | None = None,
               describable: bool = False, exclude: str | Iterable[str] = (),
               min_keep: int = 1, skipped: list[str] | None = None) -> list[Candidate]:
    """The uniform candidates meeting ``target_params`` (see the module docstring), unscored,
    counted from the parameters' metadata only (a meta model does); ``block_scores`` rank the
    blocks of a depth group where fewer are kept (all equal without); ``depths`` are the
    numbers of blocks tried instead of ``fractions`` of them (``(depth,)``: width only);
    ``describable`` keeps sizes the model's own description follows
    (:func:`fxsym.planning.described`: a hidden size or FFN width it cannot follow stays, one
    it follows in steps is a multiple of them). ``exclude`` (:func:`fxsym.plan`'s: names or
    ``fnmatch`` patterns) keeps those groups whole in every candidate, counted whole: an
    excluded hidden size is not searched, excluded FFN groups keep their width while the
    others are searched; ``min_keep`` is the fewest units a searched hidden size or FFN
    width keeps. A depth whose blocks cannot be kept (:func:`fxsym.depth.usable_blocks`:
    fewer blocks than the kinds the model needs, or blocks the config cannot say while they
    read values chosen by position) is skipped, and why is added to ``skipped`` (a list, if
    given). A :class:`~fxsym.errors.PlanError` if the target is above the model's
    (active) parameters or no candidate meets it.

    Each candidate lands as close under the target as the steps allow: its FFN-like widths
    (dense, expert and shared-expert FFNs, each a fraction of its own width, one fraction for
    all) are the widest that fit, so it lies within a width step of the target; a candidate
    whose widths stay whole (its depth and hidden size alone fit) is offered only where it is
    as close as those (without such candidates: where its hidden size could not grow a step
    and still fit; without those either, every candidate is)."""
    r = roles(symmap)
    groups = {g.name: g for g in symmap.groups()}
    depth = symmap.depth_group(r.layers) if r.layers else None
    scores = dict(block_scores or {})
    if depth is not None and scores.get(depth.name) is None:
        scores[depth.name] = torch.zeros(depth.size)
    count = counter(model, symmap, active, non_embedding)
    whole_model = count({}, None)
    what = counted(active, non_embedding)
    if target_params > whole_model:
        raise PlanError(f"the target of {target_params:,} {what} is above the model's "
                        f"{whole_model:,}: nothing to prune; give a target under "
                        f"{whole_model:,}")
    whole, said = described(model, symmap) if describable else ({}, {})
    kept = excluded_groups(symmap, exclude)
    step = {g.name: g.unit * math.lcm(g.step, said.get(g.name, (1, ""))[0])
            for g in symmap.groups()}
    hidden_now = groups[r.stream[0]].size * groups[r.stream[0]].unit if r.stream else None
    hidden_step = math.lcm(round_to, *(step[n] for n in r.stream))
    hidden_least = max((min_keep * groups[n].unit for n in r.stream), default=0)
    stream_role = r.stream_role.name if r.stream_role is not None else None
    width_roles = r.of_kind(RoleKind.WIDTH)
    hidden_least = math.ceil(hidden_least / hidden_step) * hidden_step
    ranges = _ranges(symmap, r, kept, whole, step, round_to, min_keep)
    fixed = bool((whole.keys() | kept) & set(r.stream))
    widths = (1.0,) if fixed or not hidden_now else fractions
    sized = partial(role_sizes, symmap, r, kept)
    found: list[tuple[Candidate, bool, bool]] = []
    tried: set[tuple[Any, ...]] = set()
    unusable = skipped if skipped is not None else []
    counts = ([0] if depth is None else list(depths) if depths is not None
              else [max(1, round(depth.size * lf)) for lf in fractions])
    for n_layers in counts:
        if depth is not None and not 1 <= n_layers <= depth.size:
            raise PlanError(f"{n_layers} blocks of {depth.name!r}: it has {depth.size}")
        for hf in widths:
            hidden = hidden_now if hidden_now is None or fixed else min(hidden_now, max(
                hidden_step, hidden_least, int(hidden_now * hf) // hidden_step * hidden_step))
            key = (n_layers, hidden)
            if key in tried:
                continue
            tried.add(key)
            blocks, why = kept_blocks(model, symmap, depth, scores.get(r.layers or ""), n_layers)
            if why is not None:
                if why not in unusable:
                    unusable.append(why)
                continue
            layers = layers_arg(r.layers, blocks)
            chosen = _widest(count, sized, hidden, ranges, layers, target_params)
            if chosen is None:
                continue
            sizes = sized(hidden if hidden != hidden_now else None,
                          {k: w for k, w in chosen.items() if w != ranges[k].now})
            params = count(sizes, layers)
            widths_bind = any(w < ranges[k].now for k, w in chosen.items())
            hidden_binds = (hidden is not None and hidden_now is not None
                            and hidden < hidden_now and count(sized(
                                min(hidden_now, hidden + hidden_step), {}), layers)
                            > target_params)
            role = {k.name: chosen[max((c for c in chosen if r.role_of(c) == k.name),
                                       key=lambda c: ranges[c].now)]
                    for k in width_roles if any(r.role_of(c) == k.name for c in chosen)}
            found.append((Candidate(n_layers or 0, hidden, params,
                                    classes=tuple(chosen.items()), stream_role=stream_role,
                                    role_widths=tuple((k.name, role.get(k.name))
                                                      for k in width_roles)),
                          widths_bind, hidden_binds))
    if not found:
        raise PlanError(f"no uniform candidate reaches {target_params:,} {what}" + "".join(
                            f"; skipped {why}" for why in unusable))
    bound = [c.params for c, widths_bind, _ in found if widths_bind]
    if bound:  # within a width step of the target: others only where as close
        return [c for c, widths_bind, _ in found if widths_bind or c.params >= min(bound)]
    close = [c for c, _, hidden_binds in found if hidden_binds]
    return close or [c for c, _, _ in found]


def role_sizes(symmap: SymMap, r: Roles, kept: frozenset[str], stream: int | None,
           widths: Mapping[str, int]) -> dict[str, int]:
    """:func:`sizes_for` a size of the stream role and the widths of width classes
    (``{label: entries}``, :attr:`Roles.classes`), but for the groups kept whole."""
    groups = {g.name: g for g in symmap.groups()}
    out: dict[str, int] = {}
    if stream is not None:
        role = r.stream_role
        if role is None or not r.stream:
            raise PlanError(f"no group of the model holds "
                            f"{'a stream width' if role is None else role.what}")
        put_sizes(groups, r.stream, stream, role.what, out)
    classes = dict(r.classes)
    for label, entries in widths.items():
        role = r.role(r.role_of(label))
        put_sizes(groups, (n for n in classes[label] if n not in kept), entries,
             f"{role.what if role is not None else label} ({label})", out)
    return {k: v for k, v in out.items() if k not in kept}


def class_now(symmap: SymMap, r: Roles, kept: frozenset[str]) -> dict[str, int]:
    """The width now of each width class (of its groups not kept whole)."""
    groups = {g.name: g for g in symmap.groups()}
    return {label: max(groups[n].size * groups[n].unit for n in own)
            for label, names in r.classes if (own := [n for n in names if n not in kept])}


def layers_arg(name: str | None, blocks: list[int] | None) -> Any:
    return None if name is None or blocks is None else {name: blocks}


def kept_blocks(model: nn.Module, symmap: SymMap, depth: Any, scores: Any, k: int
            ) -> tuple[list[int] | None, str | None]:
    """The ``k`` blocks of ``depth`` a candidate keeps, or why that depth is skipped
    (:func:`fxsym.depth.usable_blocks`)."""
    if depth is None:
        return None, None
    kept, why = usable_blocks(model, symmap, depth, k, scores)
    return kept, None if why is None else f"{k} blocks of {depth.container}: {why}"


def counter(model: nn.Module, symmap: SymMap, active: bool, non_embedding: bool = False
             ) -> Callable[[Mapping[str, int], Any], int]:
    """``count(sizes, layers)``: the (active or non-embedding) parameters of the plan of
    those sizes and blocks, without building it."""
    shapes_after = param_shapes(model, symmap)
    skipped = (embedding_tables(model, symmap, only_looked_up=True) if active
               else embedding_tables(model, symmap) if non_embedding else frozenset())
    shares = picked_shares(model, symmap) if active else {}
    sizes_now = {g.name: g.size for g in symmap.groups()}
    groups = symmap.depth_groups()
    # whether each parameter is left out, for each choice of blocks: a search counts
    # hundreds of plans of a few depths
    left_out: dict[tuple[tuple[str, tuple[int, ...]], ...], dict[str, bool]] = {}

    def count(sizes: Mapping[str, int], layers: Any) -> int:
        kept = layers or {}
        out = left_out.setdefault(
            tuple(sorted((name, tuple(blocks)) for name, blocks in kept.items())), {})
        total = 0.0
        for k, v in shapes_after(sizes).items():
            gone = out.get(k)
            if gone is None:
                gone = out[k] = k in skipped or renamed(k, groups, kept) is None
            if gone:
                continue
            picked, g = shares.get(k, (1, ""))
            total += math.prod(v) * picked / sizes.get(g, sizes_now.get(g, 1))
        return round(total)

    return count


def _widest(count: Callable[[Mapping[str, int], Any], int],
            sized: Callable[[int | None, Mapping[str, int]], dict[str, int]],
            hidden: int | None, ranges: Mapping[str, _Range], layers: Any,
            target: int) -> dict[str, int] | None:
    """The widest widths of the width classes (``{label: entries}``) meeting ``target``
    with that hidden size and those blocks, or ``None``: one fraction for every class, each
    class's width that fraction of its own, rounded down to its step, at least its least
    (and one step); ``sized(hidden, widths)`` gives the groups' sizes."""
    hidden_sizes = sized(hidden, {}) if hidden is not None else {}
    if not ranges:
        return None if count(hidden_sizes, layers) > target else {}

    def width(rg: _Range, f: float) -> int:
        if f >= 1:
            return rg.now
        w = int(f * rg.now + 1e-9) // rg.step * rg.step
        least = max(rg.step, math.ceil(rg.least / rg.step) * rg.step)
        return min(rg.now, max(w, least))

    def at(f: float) -> dict[str, int]:
        return {k: width(rg, f) for k, rg in ranges.items()}

    options = sorted({min(1.0, n * rg.step / rg.now) for rg in ranges.values()
                      for n in range(1, rg.now // rg.step + 1)} | {1.0})

    def fits(f: float) -> bool:
        w = at(f)
        return count(sized(hidden, {k: v for k, v in w.items() if v != ranges[k].now}),
                     layers) <= target

    best = None
    lo, hi = 0, len(options) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if fits(options[mid]):
            best, lo = options[mid], mid + 1
        else:
            hi = mid - 1
    return None if best is None else at(best)
