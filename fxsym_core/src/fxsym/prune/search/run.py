"""The search for a parameter target (:func:`search`, issue 22 §4).

The candidates (:mod:`.space`) are each planned (blocks by block importance, units by
``importance``, computed once for all of them: :func:`_scored_once`); only the ``shortlist``
candidates of lowest damage (:mod:`fxsym.prune.shortlist`: estimated from the importance
scores and block importance the calibration already gave) are scored by their loss on the
calibration batches (:mod:`.losses`, or the caller's ``evaluate``/``evaluate_all``: a
checkpoint streamed), the others ranked by that estimate alone. The plan of the lowest loss
is kept (Minitron's architecture search, in miniature: no distillation), recording the target
and the count reached (``extra["target"]``).

Imports from fxsym: depth, errors, importance, memo, planning, roles, shortlist, symbols
(console inside a function).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from ...errors import PlanError
from ...memo import one_run
from ...symbols import SymMap
from ..depth import block_importance
from ..importance import criterion_by_name
from ..planning import Plan, excluded_groups, solve, with_extra
from ..roles import roles
from ..shortlist import SHORTLIST, check_shortlist, damage
from ..shortlist import shortlist as shortlist_of
from .losses import loss_of, references
from .results import Candidate, SearchResult, target_record
from .space import FRACTIONS, candidates, class_now, kept_blocks, layers_arg, role_sizes


@one_run  # each candidate's plugin probes (described sizes, meta builds) answered once
def search(model: nn.Module, symmap: SymMap, *, target_params: int,
           batches: Iterable[Any] = (), active: bool = False, non_embedding: bool = False,
           round_to: int = 64,
           importance: Any = "l2", loss: Callable[[nn.Module, Any], torch.Tensor] | None = None,
           fractions: Sequence[float] = FRACTIONS,
           block_scores: Mapping[str, Any] | None = None,
           evaluate: Callable[[Plan], float] | None = None,
           evaluate_all: Callable[[Sequence[Plan]], Sequence[float]] | None = None,
           depths: Sequence[int] | None = None,
           describable: bool = False,
           exclude: str | Iterable[str] = (),
           min_keep: int = 1,
           progress: bool = False,
           shortlist: int | None = SHORTLIST) -> SearchResult:
    """Search uniform architectures meeting ``target_params`` (see :mod:`fxsym.prune.search`);
    nothing of ``model`` is changed.

    ``block_scores`` (``{depth group: one score per block}``) rank the blocks instead of
    :func:`~fxsym.depth.block_importance` on ``batches``; ``evaluate(plan)`` scores a
    candidate instead of running a pruned copy of ``model`` on ``batches`` (a checkpoint
    streamed layer by layer: :func:`fxsym.checkpoint.prune_checkpoint`), and then ``batches``
    may be empty; ``evaluate_all(plans)`` scores every candidate in one call instead (a
    checkpoint read once for all of them: :func:`fxsym.checkpoint.stream_losses`).
    ``depths`` are the numbers of blocks tried, ``describable`` keeps sizes the model's own
    description follows (:func:`candidates`; each plan with
    :func:`fxsym.plan`'s ``describable``); ``exclude`` and ``min_keep`` are
    :func:`fxsym.plan`'s, given to every candidate (:func:`candidates`: an excluded group
    keeps its size in all of them). ``progress`` shows the candidates being scored.

    Only the ``shortlist`` candidates of lowest damage (:func:`fxsym.shortlist.damage`,
    from ``importance``'s scores and ``block_scores``) are scored by their loss (``None``:
    all of them); the others are in the result, ranked by damage alone (``scored`` false,
    ``loss`` nan). The importance is computed once for all the candidates."""
    from ..console import track

    check_shortlist(shortlist)
    batches = list(batches)
    if not batches and ((evaluate is None and evaluate_all is None) or block_scores is None):
        raise PlanError("the search needs at least one calibration batch")
    r = roles(symmap)
    groups = {g.name: g for g in symmap.groups()}
    depth = symmap.depth_group(r.layers) if r.layers else None
    if block_scores is None:
        block_scores = (block_importance(batches)(model, symmap) if depth is not None else {})
    skipped: list[str] = []
    found = candidates(model, symmap, target_params=target_params, active=active,
                       non_embedding=non_embedding, round_to=round_to,
                       block_scores=block_scores, fractions=fractions, depths=depths,
                       describable=describable, exclude=exclude, min_keep=min_keep,
                       skipped=skipped)
    kept = excluded_groups(symmap, exclude)
    hidden_now = groups[r.stream[0]].size * groups[r.stream[0]].unit if r.stream else None
    now = class_now(symmap, r, kept)
    reference = (references(model, batches)
                 if loss is None and evaluate is None and evaluate_all is None else None)

    def label(c: Candidate) -> str:
        return ", ".join([f"layers {c.layers}",
                          *(f"{k} {w}" for k, w in c.sizes().items() if k == c.stream_role),
                          *(f"{k.replace('_', ' ')} {w}" for k, w in c.classes)])

    given = _scored_once(model, symmap, importance)
    planned = []
    for c in found:
        blocks, _ = kept_blocks(model, symmap, depth, block_scores.get(r.layers or ""), c.layers)
        p = solve(model, symmap, importance=given, scope="uniform",
                  sizes=role_sizes(symmap, r, kept, c.stream if c.stream != hidden_now else None,
                               {k: w for k, w in c.classes if w != now.get(k)}),
                  layers=layers_arg(r.layers, blocks), describable=describable,
                  exclude=exclude, min_keep=min_keep)
        planned.append(replace(c, plan=p, damage=damage(symmap, p, given(model, symmap),
                                                        block_scores)))
    picked = set(shortlist_of([c.damage for c in planned], shortlist))
    chosen = [c for i, c in enumerate(planned) if i in picked]
    if evaluate_all is not None:
        values = list(evaluate_all([c.plan for c in chosen if c.plan is not None]))
    else:
        values = []
        for c in (track(chosen, description="scoring candidates", label=label)
                  if progress else chosen):
            assert c.plan is not None
            values.append(evaluate(c.plan) if evaluate is not None
                          else loss_of(model, symmap, c.plan, batches, loss, reference))
    losses = dict(zip(sorted(picked), values, strict=True))
    scored = [replace(c, loss=losses[i]) if i in losses else replace(c, scored=False)
              for i, c in enumerate(planned)]
    best = min((c for c in scored if c.scored), key=lambda c: (math.isnan(c.loss), c.loss))
    assert best.plan is not None
    marked = replace(best, plan=with_extra(best.plan, target=target_record(
        target_params, active, best.params, non_embedding=non_embedding)))
    return SearchResult(tuple(marked if c is best else c for c in scored), marked,
                        tuple(skipped))


def _scored_once(model: nn.Module, symmap: SymMap, importance: Any
                 ) -> Callable[[nn.Module, SymMap], dict[str, torch.Tensor]]:
    """``importance`` (a criterion's name, a criterion, or scores) as a criterion computed
    once and named as :func:`fxsym.plan` names it, so every candidate is planned from the
    same scores."""
    if isinstance(importance, Mapping):
        scores: dict[str, torch.Tensor] = dict(importance)
        name = "given"
    elif isinstance(importance, str):
        scores, name = criterion_by_name(importance)(model, symmap), importance
    elif callable(importance):
        scores, name = importance(model, symmap), getattr(importance, "__name__", "custom")
    else:
        raise PlanError(f"importance must be a criterion's name, a criterion or {{group name: "
                        f"scores}}; got a {type(importance).__name__}")

    def given(m: nn.Module, s: SymMap) -> dict[str, torch.Tensor]:
        return scores

    given.__name__ = name
    return given
