"""The value oracle: dropping units of a group must compute what the full model computes with
those units zeroed where they are read.

:func:`check_values` builds the value plan (:mod:`.valueplan`), sets aside the groups it
cannot check (routed, met by a mixing op or a mixing module (:mod:`.mixing`), sized inside a
leaf, a chunk block of one unit), then per seed compares the copy resized without the dropped
units with the full copy whose reads of them see zero (:mod:`.zeroing`); on a mismatch each
group is dropped alone to name the culprits.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..symbols import ATTRIBUTE_PREFIX, SymGroup, SymMap
from .mixing import _mixing_modules
from .perturb import PerturbedCopy
from .precision import _Precision
from .result import OracleResult, _blame
from .running import _bound
from .valueplan import _value_plan, _ValuePlan
from .zeroing import _zero_reads


def check_values(model: nn.Module, symmap: SymMap, example_inputs: Any, *,
                 seeds: Iterable[int] = (0, 1), tolerance: float | None = None,
                 dtype: torch.dtype | None = None, memory_budget: int | None = None
                 ) -> OracleResult:
    """Drop units of every group and compare by value with the model whose consumers no
    longer read those units.

    For each seed a :func:`perturbed` copy, in float64 wherever the model runs in it, gives
    two models: the copy resized to keep every group but some of its units (seed 0 drops one
    unit, seed 1 and later half of them, at random places, the blocks of a ``chunk`` alike),
    and the full copy in which every read of a dropped unit sees zero: the inputs of every
    module call that reads the group (a conv's or a linear's input: zeroing a unit there is
    zeroing its columns) and the parameter operands of functional linear ops (``F.linear``,
    ``matmul``...) where the group's dim is contracted. Where the analysis is right the
    dropped units have no other way to the outputs, so both models compute the same outputs,
    to :data:`VALUE_TOLERANCE` relative to each output's scale. A window that a resize moves
    (a slice counted from the end whose tail was left free), a branch on a size, a size used
    as a number all change the outputs. On a mismatch each group is dropped alone to name
    the culprits.

    Where a group's dim meets an op that mixes its entries (a normalisation over it, a
    softmax along it, a reduction or a product of two activations over it), dropping is not
    zeroing even for a right group: the group is *not checked by value*, listed with the reason
    in ``unchecked``, and counts neither way; ``status`` is ``"not checked"`` when no group
    was checked. The layouts come from the analysis (``GroupAnalysis.node_layouts``). A
    *routed* group (``SymGroup.routed``: the experts a router's ``topk`` picks among) is not
    checked either: dropping an expert changes which experts are picked, by design.

    The copies run in float64 unless they do not fit in the memory available (or the
    ``memory_budget``, in bytes) or ``dtype`` says otherwise (:class:`_Precision`); in float32
    the tolerance is float32's and a note says why.
    """
    symmap = _bound(model, symmap, example_inputs)
    seeds = tuple(seeds)
    result = OracleResult(seeds=seeds)
    analysis = symmap.analysis
    graph = symmap.graph
    groups = [g for g in symmap.groups() if g.size > 1]
    if analysis is None or graph is None or not groups:
        return result
    plan = _value_plan(symmap, graph)
    by_name = {g.name: g for g in symmap.groups()}
    modules = dict(symmap.model.named_modules())
    classes: list[list[SymGroup]] = []
    seen: set[str] = set()
    for g in groups:
        if g.name in seen:
            continue
        members = [g, *(by_name[n] for n in g.same_size if n in by_name)]
        seen.update(m.name for m in members)
        why = next((f"{m.name}: {ROUTED}" for m in members if m.routed), None)
        if why is None:
            why = next((f"{m.name}: {plan.unchecked[m.id]}" for m in members
                        if m.id in plan.unchecked), None)
        if why is None:
            why = next((w for m in members if (w := _inside_leaf(symmap, modules, m))), None)
        if why is None and any(m.size < 2 for m in members):
            why = "a block of a chunk has one unit"
        if why is not None:
            for m in members:
                result.unchecked[m.name] = why
            continue
        classes.append(members)
    precision = _Precision(result, tolerance, model=model, dtype=dtype,
                           memory_budget=memory_budget)
    if classes:
        gen = torch.Generator().manual_seed(seeds[0] if seeds else 0)
        mixing = _mixing_modules(model, symmap, example_inputs, plan, seeds[0] if seeds else 0,
                                 precision, [d for c in classes for d in _drops(c, 0, gen)])
        for c in [c for c in classes if any(m.id in mixing for m in c)]:
            why = next(f"{m.name}: {mixing[m.id]}" for m in c if m.id in mixing)
            result.unchecked.update({m.name: why for m in c})
            classes.remove(c)
    result.checked = sum(len(c) for c in classes)
    if not classes:
        return result
    for seed in seeds:
        gen = torch.Generator().manual_seed(seed)
        drops = {c[0].name: _drops(c, seed, gen) for c in classes}
        if _same_values(model, symmap, example_inputs, seed, precision, plan,
                        [d for c in classes for d in drops[c[0].name]], result):
            continue
        culprits = [c for c in classes if not _same_values(
            model, symmap, example_inputs, seed, precision, plan, drops[c[0].name], None)]
        for c in culprits:
            for m in c:
                _blame(result, m.name)
        if not culprits:
            result.error = (f"seed {seed}: outputs changed with every group dropped at once, "
                            "but with none alone")
    return result


#: why the value oracle does not check a routed group (``SymGroup.routed``)
ROUTED = ("an op picks its entries by value (topk): dropping one changes what is picked, "
          "by design (checked by the permutation and shrink oracles only)")


def _inside_leaf(symmap: SymMap, modules: dict[str, nn.Module], group: SymGroup) -> str | None:
    """Why ``group`` cannot be checked by value if a member sizes something inside a module
    called as a leaf (heads inside an attention module): the graph does not show its reads."""
    analysis = symmap.analysis
    for qualname, sname in group.members:
        mod = modules.get(qualname)
        if (analysis is not None and (qualname, sname) in analysis.param_members) or (
                sname.startswith(ATTRIBUTE_PREFIX) or mod is None or mod not in symmap):
            continue
        if sname in symmap[mod] and not symmap.get_symbol(mod, sname).is_cross_layer:
            return f"{qualname}.{sname} sizes the inside of a leaf module, whose reads " \
                   "the traced graph does not show"
    return None


def _drops(members: list[SymGroup], seed: int, gen: torch.Generator
           ) -> list[tuple[SymGroup, list[int]]]:
    """The units each group of a same-size class drops for ``seed``: one for seed 0, half for
    the others, at random places, as many in every group of the class."""
    size = members[0].size
    count = 1 if seed == 0 else max(1, size // 2)
    return [(m, sorted(torch.randperm(m.size, generator=gen)[:count].tolist()))
            for m in members]


def _same_values(model: nn.Module, symmap: SymMap, example_inputs: Any, seed: int,
                 precision: _Precision, plan: _ValuePlan,
                 drops: list[tuple[SymGroup, list[int]]], result: OracleResult | None) -> bool:
    """Whether the copy with ``drops`` resized away computes what the full copy computes with
    those units zeroed where they are read; mismatches are described in ``result``."""
    dropped = {g.id: torch.tensor(units) for g, units in drops}

    def zeroed_run() -> list[torch.Tensor]:
        with PerturbedCopy(model, seed, symmap, precision.dtype) as c:
            table = c.symmap.analysis.table if c.symmap.analysis else None
            handles = _zero_reads(c.model, plan, dropped, table)
            try:
                return precision.forward(c.model, example_inputs, symmap.output_contract)
            finally:
                for h in handles:
                    h.remove()

    reference = precision.run(zeroed_run)
    dtype, tol = precision.dtype, precision.tolerance
    keep = {g.name: [u for u in range(g.size) if u not in set(units)] for g, units in drops}
    try:
        with PerturbedCopy(model, seed, symmap, dtype, keep) as c:
            out = precision.forward(c.model, example_inputs, symmap.output_contract)
    except Exception as exc:
        if result is not None:
            result.details.append(f"seed {seed}: the dropped model fails: "
                                  f"{type(exc).__name__}: {exc}")
        return False
    if len(out) != len(reference):
        return False
    same = True
    for i, (a, b) in enumerate(zip(out, reference)):
        scale = max(1.0, float(b.abs().max())) if b.numel() else 1.0
        if a.shape != b.shape or not torch.allclose(a.to(dtype), b.to(dtype), rtol=tol,
                                                     atol=tol * scale):
            same = False
            if result is not None:
                diff = float((a - b).abs().max()) if a.shape == b.shape else float("nan")
                result.details.append(f"seed {seed}: output {i} differs by {diff:.3g} "
                                      f"(scale {scale:.3g})")
    return same
