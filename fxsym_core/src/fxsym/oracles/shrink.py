"""The shrink oracle: halving every group must give a model that runs, keeps its output shapes,
and whose every member has the chosen size.

The members are measured three ways, none of which knows a module family: a parameter or
attribute member by its tensor's shape or its value, a module's cross-layer symbol by the
input or output dim it sizes on a run (forward hooks), and every resized module's int
attributes against the weight dims they equalled before (a stale attribute is a bug even
when the forward pass happens to run). See :func:`check_shrink`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..analysis.analyzer import resolve_dim
from ..analysis.outputs import Contract
from ..resizing.declared import symbol_sizes
from ..symbols import ATTRIBUTE_PREFIX, SymGroup, SymMap, attribute_value
from .perturb import PerturbedCopy
from .result import OracleResult, _blame
from .running import _attribute, _bound, run_model


def check_shrink(model: nn.Module, symmap: SymMap, example_inputs: Any, *,
                 seed: int = 0) -> OracleResult:
    """Halve every group of a perturbed copy; it must run, keep its output shapes, and every
    member must have the chosen size.

    The members are checked three ways, none of which knows a module family:

    * a parameter member ``(owner, "name:dim")``: the tensor's ``shape[dim]``; an attribute
      member ``(owner, "attr:name")`` (an int attribute read as a size): its value; an
      attribute a leaf's SymInfo declares (:meth:`fxsym.SymInfo.declare`): its value must be
      its expression over the symbols' chosen sizes;
    * a module member with a cross-layer symbol: on a run of the shrunk copy, the size of the
      input (INCOMING) or output (OUTGOING) dimension the symbol's ``elastic_dims`` name, at
      every call — the module's weights must have produced or accepted it;
    * every resized module's integer attributes: one that equalled the size of a weight
      dimension that changed must still equal the size of one of the dimensions it equalled
      (``Conv2d.out_channels`` follows ``weight.shape[0]``; a stale attribute is a bug even
      when the forward pass happens to run). This fails the check for an attribute named
      like one of the module's SymInfo symbols or declared by it (its resize owns it); any other
      attribute — of such a module, or of a module that only owns parameter members
      (``(owner, "name:dim")``, resized entry by entry) — may equal a weight dimension by
      coincidence (a window of 3 beside 3 heads), so it is listed in ``notes``.

    The expected size of a member's dimension follows its layout: the chosen share of each
    group laid along it, fixed entries unchanged.
    """
    symmap = _bound(model, symmap, example_inputs)
    groups = symmap.groups()
    result = OracleResult(checked=len(groups), seeds=(seed,))
    if not groups:
        return result
    with PerturbedCopy(model, seed, symmap, None) as c:
        _shrink(c, groups, example_inputs, symmap.output_contract, result)
    return result


def _shrink(c: PerturbedCopy, groups: list[SymGroup], example_inputs: Any,
            contract: Contract | None, result: OracleResult) -> None:
    """:func:`check_shrink` on the copy ``c``."""
    clone, sm = c.model, c.symmap
    reference = run_model(clone, example_inputs, contract)
    chosen = {g.name: max(g.min_size, g.size // 2) for g in groups}
    modules = dict(clone.named_modules())
    members = {m for g in groups for m in g.members}
    owners = {q for q, _ in members if q in modules}
    before = {q: _weight_shapes(modules[q]) for q in owners}
    attrs = {q: _int_attributes(modules[q]) for q in owners}
    expected = _expected_lengths(sm, chosen)
    param_members = sm.analysis.param_members if sm.analysis else frozenset()
    declared = _declared_values(sm, modules, members - param_members, expected)
    try:
        c.resize(chosen)
    except Exception as exc:
        result.error = f"resize failed: {type(exc).__name__}: {exc}"
        return
    observed: dict[tuple[str, str], set[int]] = {}
    handles = _measure(sm, modules, observed, {k for k in expected if k not in param_members})
    try:
        out = run_model(clone, example_inputs, contract)
    except Exception as exc:
        result.error = f"the shrunk model fails: {type(exc).__name__}: {exc}"
        return
    finally:
        for h in handles:
            h.remove()
    if [t.shape for t in out] != [t.shape for t in reference]:
        result.error = f"output shapes changed: {[tuple(t.shape) for t in out]}"
    group_of = {m: g.name for g in groups for m in g.members}
    for key, length in expected.items():
        qualname, sname = key
        got: set[int] | None
        if key in param_members:
            pname, _, dim = sname.rpartition(":")
            if not dim.isdigit():  # an int attribute read as a size: "attr:width"
                value = attribute_value(modules.get(qualname), dim)
                got = {value} if isinstance(value, int) else None
                if got is None:
                    result.details.append(f"{qualname}.{dim}: no longer an int ({value!r})")
                    _blame(result, group_of.get(key, qualname))
            else:
                tensor = _attribute(modules.get(qualname), pname)
                got = ({int(tensor.shape[int(dim)])} if isinstance(tensor, torch.Tensor)
                       else None)
        else:
            got = observed.get(key)
        if got is not None and got != {length}:
            result.details.append(f"{qualname}.{sname}: size {sorted(got)}, expected {length}")
            _blame(result, group_of.get(key, qualname))
    for (qualname, sname), value in declared.items():
        attr = sname.removeprefix(ATTRIBUTE_PREFIX)
        got_value = getattr(modules[qualname], attr, None)
        if got_value != value:
            result.details.append(f"{qualname}.{attr}: {got_value!r}, declared {value}")
            _blame(result, group_of.get((qualname, sname), qualname))
    for q in owners:
        described = modules[q] in sm
        symbols = set(sm[modules[q]]) if described else set()
        if described:
            symbols |= set(sm.sym_info(modules[q]).attributes)
        for attr, problem in _stale_attributes(modules[q], before[q], attrs[q]):
            if attr.partition("[")[0] not in symbols:
                # not a size the SymInfo names (or no SymInfo, so no resize rule that could
                # keep it up to date): equal to a weight dim maybe only by coincidence
                result.notes.append(f"{q}.{attr}: {problem}")
                continue
            result.details.append(f"{q}.{attr}: {problem}")
            _blame(result, next((g for (m, _), g in group_of.items() if m == q), q))


def _declared_values(sm: SymMap, modules: dict[str, nn.Module],
                     members: set[tuple[str, str]],
                     lengths: dict[tuple[str, str], int]) -> dict[tuple[str, str], int]:
    """Each declared attribute member ``(module, "attr:name")``: its expression over the
    module's symbols once ``lengths`` (entries of each resized symbol) apply."""
    out: dict[tuple[str, str], int] = {}
    for qualname, sname in members:
        mod = modules.get(qualname)
        if not sname.startswith(ATTRIBUTE_PREFIX) or mod is None or mod not in sm:
            continue
        expr = sm.sym_info(mod).attributes.get(sname.removeprefix(ATTRIBUTE_PREFIX))
        if expr is None:
            continue
        sizes = symbol_sizes(sm, mod, lengths)
        if all(s in sizes for s in expr.symbols):
            out[(qualname, sname)] = expr.evaluate(sizes)[0]
    return out


def _expected_lengths(sm: SymMap, chosen: dict[str, int]) -> dict[tuple[str, str], int]:
    """For every symbol laid along a group: its dimension's length once ``chosen`` applies."""
    analysis = sm.analysis
    if analysis is None:
        return {}
    table = analysis.table
    units = {g.id: (g.size, chosen[g.name]) for g in analysis.groups if g.name in chosen}
    out: dict[tuple[str, str], int] = {}
    for key, dim in analysis.symbol_dims.items():
        total, touched = 0, False
        for seg in dim:
            root = table.find(seg.group) if seg.group is not None else None
            if root in units:
                old, new = units[root]
                total += seg.units * new // old * seg.block
                touched = True
            else:
                total += seg.units * seg.block
        if touched:
            out[key] = total
    return out


def _measure(sm: SymMap, modules: dict[str, nn.Module],
             observed: dict[tuple[str, str], set[int]],
             keys: set[tuple[str, str]]) -> list[Any]:
    """Forward hooks recording the size of each member's input or output dimension."""
    by_module: dict[str, list[tuple[str, Any]]] = {}
    for qualname, sname in keys:
        mod = modules.get(qualname)
        if mod is None or mod not in sm:
            continue
        sym = sm.get_symbol(mod, sname)
        if sym.is_cross_layer:
            by_module.setdefault(qualname, []).append((sname, sym))

    def hook_for(qualname: str, symbols: list[tuple[str, Any]]) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
            if isinstance(output, (tuple, list)) and output:
                output = output[0]
            for sname, sym in symbols:
                value = tensors[0] if sym.is_incoming and tensors else output
                if not isinstance(value, torch.Tensor):
                    continue
                d = resolve_dim(sym.elastic_dims, value.dim())
                if d is not None:
                    observed.setdefault((qualname, sname), set()).add(int(value.shape[d]))
        return hook

    return [modules[q].register_forward_hook(hook_for(q, syms), with_kwargs=True)
            for q, syms in by_module.items()]


def _weight_shapes(mod: nn.Module) -> dict[str, tuple[int, ...]]:
    tensors = [*mod.named_parameters(recurse=False), *mod.named_buffers(recurse=False)]
    return {n: tuple(t.shape) for n, t in tensors if t is not None}


def _int_attributes(mod: nn.Module) -> dict[str, tuple[int, ...]]:
    """The module's integer attributes (tuples of ints element by element)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, value in vars(mod).items():
        if name.startswith("_"):
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            out[name] = (value,)
        elif isinstance(value, (tuple, list)) and value and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value):
            out[name] = tuple(value)
    return out


def _stale_attributes(mod: nn.Module, before: dict[str, tuple[int, ...]],
                      attrs: dict[str, tuple[int, ...]]) -> list[tuple[str, str]]:
    after = _weight_shapes(mod)
    problems: list[tuple[str, str]] = []
    now = _int_attributes(mod)
    for attr, values in attrs.items():
        current = now.get(attr)
        if current is None or len(current) != len(values):
            continue
        for i, (old, new) in enumerate(zip(values, current)):
            places = [(n, d) for n, shape in before.items() if n in after
                      and len(after[n]) == len(shape) for d, size in enumerate(shape)
                      if size == old]
            if not places or all(after[n][d] == before[n][d] for n, d in places):
                continue  # no weight dimension of that size changed
            if not any(after[n][d] == new for n, d in places):
                where = ", ".join(f"{n}.shape[{d}]={after[n][d]}" for n, d in places)
                label = attr if len(values) == 1 else f"{attr}[{i}]"
                problems.append((label, f"is {new} but the weights it sized are now {where}"))
    return problems
