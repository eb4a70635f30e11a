"""``fxsym.plan``: the units each group keeps, solved for an amount.

Each group's units are ranked by an importance criterion
(:mod:`fxsym.importance`). ``scope="uniform"`` removes the same fraction of every group;
``scope="global"`` removes the lowest units over all groups, each group's scores divided by
their mean so groups compare. A ``ratio`` is that fraction of units; ``target_params`` or
``target_macs`` is met by bisection on it: the plan is the smallest cut that reaches the target,
so it misses it by less than one rounding step. Kept sizes are rounded up to a multiple of
``round_to`` (never past the group's size), at least ``min_keep`` and at least the group's
own ``min_size`` (a router's ``topk`` over the experts needs ``k`` of them), then up to a
multiple of the group's own ``step`` (what the model's kernels take: transformers'
``grouped_mm`` experts need 16-byte strides; the groups a plan so shrinks are listed with
the reason in ``plan.extra["steps"]``), or the whole group; groups listed in
``exclude`` (names or ``fnmatch`` patterns), groups the criterion cannot score and groups of
one unit stay whole; groups tied by ``same_size`` keep as many units as each other.
"""

from __future__ import annotations

import fnmatch
import glob
import math
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from ...errors import PlanError
from ...paramlayout import ParamLayout, layout
from ...symbols import SymMap, combine_step
from ..depth import renamed
from ..embeddings import embedding_tables
from ..importance import Criterion, unit_scores
from ..options import check_amount_values
from ..request import PruneRequest
from .amounts import _given_sizes, _unreachable
from .blocks import _blocks_kept, _with_depth, _without
from .counts import _mac_model, _MacModel
from .data import GroupChoice, Plan, _class_path, with_extra
from .describable import described
from .exclude import _exclude_patterns
from .inputs import input_spec
from .units import _Candidate, _check_finite, _criterion_scores, _global_order, _same_size_classes


def plan(
    model: nn.Module,
    symmap: SymMap,
    *,
    ratio: float | None = None,
    target_params: int | None = None,
    target_macs: int | None = None,
    importance: str | Criterion | Mapping[str, torch.Tensor] = "l2",
    scope: str | None = None,
    round_to: int = 1,
    min_keep: int = 1,
    exclude: str | Iterable[str] = (),
    layers: Any = None,
    depth_importance: Any = None,
    sizes: Mapping[str, int] | None = None,
    describable: bool = False,
    target_non_embedding_params: int | None = None,
    param_ratio: float | None = None,
) -> Plan:
    """Choose the units to keep in each group of ``model`` (analyzed in ``symmap``).

    Exactly one of ``ratio`` (the fraction of units to remove, in ``[0, 1)``),
    ``param_ratio`` (the fraction of parameters to remove: a ``target_params`` of the rest),
    ``target_params``, ``target_non_embedding_params`` (every parameter but the embedding
    tables, tied or not: :mod:`fxsym.prune.embeddings`) or ``target_macs`` (counts to reach or go
    under) says how much.
    ``importance`` is a criterion of :mod:`fxsym.importance` (``"l1"``, ``"l2"``,
    ``"bn_scale"``, or a callable such as ``fxsym.importance.taylor(loss_fn, batches)``) or
    precomputed scores ``{group name: one score per unit}``. See the module docstring for
    ``scope``, ``round_to``, ``min_keep`` and ``exclude`` (one string is one pattern; a
    pattern matching no group is an error). Nothing is modified.

    ``layers`` drops blocks of the depth groups (:meth:`SymMap.depth_groups`): a count of
    blocks to keep, the positions to keep, or ``{depth group: either}`` (:mod:`fxsym.depth`);
    a count keeps the blocks ``depth_importance`` scores highest (``{depth group: scores}``,
    or a criterion such as ``fxsym.depth.block_importance(batches)``; by default block
    influence on the traced example inputs). With ``layers``, the width amount may be left
    out (depth only); ``target_params``/``target_macs`` count the model without the dropped
    blocks.

    ``describable=True`` keeps whole the groups the plugins say the model's own description
    could not follow (``fxsym_undescribed_groups``: a diffusers config with one field for
    sizes a resize cannot change), as ``exclude`` does, and rounds those it describes only in
    steps to them (a transformers config whose class checks ``hidden_size`` against the
    heads); the reasons are in ``plan.extra["undescribed"]`` and ``plan.extra["steps"]``. A
    uniform plan then gives a model its library saves and rebuilds with
    ``save_pretrained``/``from_pretrained``.

    ``sizes`` (``{group name: units to keep}``) is the width amount given group by group
    instead (the groups not named stay whole; :mod:`fxsym.search` derives it from a hidden
    size, an FFN width, head counts); it is rounded like the other amounts.

    The options are checked together first, as the
    :class:`~fxsym.prune.request.PruneRequest` of a model in memory that is not searched
    (``fxsym prune MODEL --no-search``: the rules and messages ``fxsym prune`` and
    :func:`fxsym.prune_checkpoint` use; ``importance``, a criterion here, is checked by
    :mod:`fxsym.importance`); ``scope`` (default ``"global"``; for a parameter target on a
    model with a stack of residual blocks the request's default is ``"uniform"``, and leaving
    it out there warns with a :class:`FutureWarning` that the default will follow) given with
    ``sizes`` or with ``layers`` alone, where it changes nothing, is left out with a
    :class:`DeprecationWarning` giving the request's refusal. Every argument is checked: a
    NaN, an infinity or a value of another type is a :class:`~fxsym.errors.PlanError` naming
    it, and so is a NaN or infinite score (it would rank its unit arbitrarily; the error names
    the group, the unit and the parameters holding non-finite weights there).
    """
    request = PruneRequest(
        ratio=ratio, param_ratio=param_ratio, target_params=target_params,
        target_non_embedding_params=target_non_embedding_params, target_macs=target_macs,
        sizes=sizes, layers=tuple(layers) if isinstance(layers, (list, tuple)) else layers,
        search=False, scope=scope, round_to=round_to, min_keep=min_keep)
    checked = request.check(lenient=("scope",)).on_model(stack=bool(symmap.depth_groups()))
    for unused in checked.deprecated:
        warnings.warn(f"{unused} (left out for now; refused in a later version, as fxsym "
                      "prune and a PruneRequest refuse it)", DeprecationWarning, stacklevel=2)
    if scope is None and checked.scope != "global" and request.parameter_target() and not sizes:
        warnings.warn("fxsym.plan plans a parameter target on a model with a stack of residual "
                      "blocks globally when scope is left out, where fxsym prune and a "
                      "PruneRequest plan it uniformly (every block keeps one shape: what a "
                      "config describes); the default becomes 'uniform' in a later version: "
                      "give scope='global' to keep this plan, or scope='uniform'",
                      FutureWarning, stacklevel=2)
    if param_ratio is not None:  # the model's count only where a fraction of it is asked
        target_params = request.counted(sum(p.numel() for p in model.parameters())).target_params
    return solve(model, symmap, ratio=ratio, target_params=target_params,
                 target_macs=target_macs, importance=importance, scope=scope or "global",
                 round_to=round_to, min_keep=min_keep, exclude=exclude, layers=layers,
                 depth_importance=depth_importance, sizes=sizes, describable=describable,
                 target_non_embedding_params=target_non_embedding_params)


def solve(
    model: nn.Module,
    symmap: SymMap,
    *,
    ratio: float | None = None,
    target_params: int | None = None,
    target_macs: int | None = None,
    importance: str | Criterion | Mapping[str, torch.Tensor] = "l2",
    scope: str = "global",
    round_to: int = 1,
    min_keep: int = 1,
    exclude: str | Iterable[str] = (),
    layers: Any = None,
    depth_importance: Any = None,
    sizes: Mapping[str, int] | None = None,
    describable: bool = False,
    target_non_embedding_params: int | None = None,
) -> Plan:
    """:func:`plan` of options already checked together (a request's: the search's
    candidates, :func:`fxsym.prune_checkpoint`, ``fxsym prune``); only what depends on the
    model is checked here (the targets, the sizes, ``exclude``, the scores)."""
    if (layers is not None or sizes is not None) and (
            ratio is None and target_params is None and target_macs is None
            and target_non_embedding_params is None):
        ratio = 0.0
    check_amount_values(round_to=round_to, min_keep=min_keep)  # the search's own options
    lay = layout(model, symmap)
    macs = _mac_model(model, symmap)
    tables = embedding_tables(model, symmap)
    counted = frozenset() if target_non_embedding_params is None else tables
    whole = sum(math.prod(v) for k, v in lay.shapes.items() if k not in tables)
    if target_non_embedding_params is not None and target_non_embedding_params > whole:
        raise PlanError(f"target_non_embedding_params {target_non_embedding_params:,} is above "
                        f"the model's {whole:,} non-embedding parameters: nothing to prune; "
                        f"give a target under {whole:,}")
    if target_params is not None and target_params > lay.param_count({}):
        raise PlanError(f"target_params {target_params:,} is above the model's "
                        f"{lay.param_count({}):,} parameters: nothing to prune; give a target "
                        f"under {lay.param_count({}):,}")
    groups = symmap.groups()
    depth_notes: list[str] = []
    blocks = _blocks_kept(model, symmap, layers, depth_importance, depth_notes)
    dropped = frozenset(n for n in lay.shapes
                        if renamed(n, symmap.depth_groups(), blocks) is None)
    patterns = _exclude_patterns(exclude, groups)
    undescribed, described_steps = described(model, symmap) if describable else ({}, {})
    patterns += [glob.escape(name) for name in undescribed]
    steps: dict[str, tuple[int, str]] = {}
    for g in groups:
        more, why = described_steps.get(g.name, (1, ""))
        steps[g.name] = combine_step((g.step, g.step_reason), more, 1, why)
    label, scores = _criterion_scores(model, symmap, importance, groups)
    candidates: list[_Candidate] = []
    for g in groups:
        if g.size <= max(min_keep, g.min_size) or any(
                fnmatch.fnmatchcase(g.name, p) for p in patterns):
            continue
        s = unit_scores(g, scores)
        if s is not None:
            _check_finite(model, lay, g, s, label)
            candidates.append(_Candidate(g, s))
    classes = _same_size_classes(groups)

    def kept_for(counts: Mapping[str, int]) -> dict[str, int]:
        out = {}
        for c in candidates:
            size, step = c.group.size, steps[c.group.name][0]
            least = max(min_keep, c.group.min_size)
            k = max(least, math.ceil(counts[c.group.name] / round_to) * round_to)
            out[c.group.name] = min(size, math.ceil(k / step) * step)
        for members in classes:  # blocks of one chunk keep as many units: the most of them,
            inside = [out.get(n) for n in members]  # all if one of them must stay whole
            top = max(lay.sizes[n] if k is None else k for n, k in zip(members, inside))
            for n in members:
                out[n] = min(top, lay.sizes[n])
        return out

    def uniform(r: float) -> dict[str, int]:
        return kept_for({c.group.name: math.ceil(c.group.size * (1 - r) - 1e-9)
                         for c in candidates})

    everyone = (_global_order(candidates) if scope == "global"
                else torch.zeros(0, dtype=torch.long))

    def global_(n: int) -> dict[str, int]:
        removed = torch.bincount(everyone[:n], minlength=len(candidates)).tolist()
        return kept_for({c.group.name: c.group.size - r for c, r in zip(candidates, removed)})

    def measure(kept: Mapping[str, int]) -> int:
        if target_macs is not None:
            return macs.count(_without(lay.shapes_after(kept), dropped))
        if dropped or counted:
            return sum(math.prod(v) for k, v in lay.shapes_after(kept).items()
                       if k not in dropped and k not in counted)
        return lay.param_count(kept)

    if sizes is not None:
        kept = kept_for(_given_sizes(sizes, groups, candidates))
    elif ratio is not None:
        kept = uniform(ratio) if scope == "uniform" else global_(int(ratio * len(everyone)))
    else:
        target = next(x for x in (target_params, target_non_embedding_params, target_macs)
                      if x is not None)
        what = ("MACs" if target_macs is not None else "non-embedding parameters" if counted
                else "parameters")
        if scope == "uniform":
            lo, hi = 0.0, 1.0
            if measure(uniform(hi)) > target:
                raise PlanError(_unreachable(what, target, measure(uniform(hi))))
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if measure(uniform(mid)) <= target else (mid, hi)
            kept = uniform(hi)
        else:
            lo_n, hi_n = 0, len(everyone)
            if measure(global_(hi_n)) > target:
                raise PlanError(_unreachable(what, target, measure(global_(hi_n))))
            while lo_n < hi_n:
                mid_n = (lo_n + hi_n) // 2
                if measure(global_(mid_n)) <= target:
                    hi_n = mid_n
                else:
                    lo_n = mid_n + 1
            kept = global_(hi_n)
    made = _make_plan(model, symmap, lay, macs, kept, {c.group.name: c.scores
                                                       for c in candidates}, label, scope)
    if undescribed:
        made = with_extra(made, undescribed=undescribed)
    stepped = {g.name: {"step": steps[g.name][0], "unit": g.unit, "why": steps[g.name][1]}
               for g in groups if steps[g.name][0] > 1 and kept.get(g.name, g.size) < g.size}
    if stepped:
        made = with_extra(made, steps=stepped)
    if tables:
        after = lay.shapes_after(kept)
        made = with_extra(made, non_embedding={
            "before": made.params_before - sum(math.prod(lay.shapes[t]) for t in tables),
            "after": made.params_after - sum(math.prod(after[t]) for t in tables)
            - sum(math.prod(after[n]) for n in dropped if n not in tables)})
    if depth_notes:
        made = with_extra(made, notes=[*(made.extra.get("notes") or ()), *depth_notes])
    return _with_depth(made, symmap, blocks, dropped, macs)


def _make_plan(model: nn.Module, symmap: SymMap, lay: ParamLayout, macs: _MacModel,
               kept: Mapping[str, int], scores: Mapping[str, torch.Tensor], label: str,
               scope: str) -> Plan:
    shapes_after = lay.shapes_after(kept)
    macs_before = macs.count(lay.shapes)
    params_before = lay.param_count({})
    choices = []
    for g in symmap.groups():
        k = kept.get(g.name, g.size)
        if k == g.size:
            choices.append(GroupChoice(g.name, g.size, g.unit))
            continue
        s = scores.get(g.name)
        top = torch.arange(k) if s is None else torch.topk(s, k, sorted=False).indices
        keep = tuple(top.sort().values.tolist())
        alone = lay.changed_shapes({g.name: k})
        choices.append(GroupChoice(
            g.name, g.size, g.unit, keep,
            sum(math.prod(lay.shapes[p]) - math.prod(shape) for p, shape in alone.items()),
            sum(macs.weights.get(p, 0) * (math.prod(lay.shapes[p]) - math.prod(shape))
                for p, shape in alone.items())))
    spec = input_spec(symmap.example_inputs)
    return Plan(model=_class_path(model), groups=tuple(choices), params_before=params_before,
                params_after=sum(math.prod(s) for s in shapes_after.values()),
                macs_before=macs_before, macs_after=macs.count(shapes_after),
                shapes=shapes_after, inputs=spec, outputs=symmap.output_contract,
                importance=label, scope=scope,
                extra={"analysis": dict(symmap.analysis_options)}
                if symmap.analysis_options else {})
