"""Tensors reached from more than one place: every place must keep the same entries.

A parameter or buffer can be reached from several places of one model:

* a leaf module that owns it, and a ``get_attr`` read of the same tensor elsewhere in the graph
  (a tied autoencoder's ``F.linear(h, self.enc.weight.t())``);
* two leaves sharing one ``Parameter`` object (a ``lm_head`` tied to the input embedding, T5's
  and Bart's embedding shared by encoder and decoder).

A resize keeps the same entries of each dim of the tensor at every place, so what sizes that
dim at each place is unified into one group. At a ``get_attr`` read the dim's own layout says
what sizes it. At a leaf nothing is guessed from names: the leaf's resize rule runs on a
*meta copy* of the module, once per attached symbol, keeping all but that symbol's last unit;
a dim of the tensor that shrinks by exactly that unit, under no other symbol, is sized by that
symbol (the contract of a resize rule is to keep the given entries of its symbol's dimension
in every tensor it sizes). A dim that no symbol sizes, or that several do, or a rule that
fails on the copy, pins every group that meets the dim.

A ``get_attr`` read tied this way is not a parameter member: the leaf's resize rule already
slices the tensor, and ``resize`` re-shares tensors that were shared before.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.fx
from torch import nn

from ..registry import Registry, SymInfoEntry
from ..symbols import SymMap
from ..tracer.tracer import meta_copy
from .context import AnalysisState, OpContext, Unsupported
from .layout import Dim, Layout, TensorLayout, dim_size
from .submodules import Submodules


class AnalyzerState(AnalysisState, Protocol):
    """What tying shared tensors needs of the analyzer
    (:class:`fxsym.analysis.analyzer.Analyzer`, which imports this module)."""

    gm: torch.fx.GraphModule
    symmap: SymMap
    registry: Registry
    symbol_dims: dict[tuple[str, str], Dim]
    param_reads: dict[str, Layout]
    #: the model's submodules by path
    model_modules: Submodules

    def drop_parameter_member(self, target: str) -> None: ...

#: a dim that no symbol of a leaf sizes, or that several size: it pins what meets it
_PIN = "pin"

#: what a probe of one symbol found: the leaf's tensor shapes after its rule kept all but one
#: unit, that unit's length in entries, and the symbol's Dim (``None``: the rule failed)
Probe = tuple[dict[str, tuple[int, ...]], int, Dim] | None


@dataclass(frozen=True)
class _Place:
    """One way the graph reaches a tensor: through a leaf (``rel`` inside it) or ``get_attr``."""

    node: torch.fx.Node
    leaf: str | None = None
    rel: str = ""


def tie_shared_tensors(an: AnalyzerState) -> None:
    """Unify, dim by dim, what sizes each tensor at each of its places (see the module doc)."""
    places: dict[int, list[_Place]] = {}
    tensors: dict[int, torch.Tensor] = {}
    model = an.model_modules
    leaves: set[str] = set()
    for node in an.gm.graph.nodes:
        if node.op == "call_module" and str(node.target) not in leaves:
            leaves.add(str(node.target))
            mod = model(str(node.target))
            for rel, t in _named_tensors(mod):
                tensors[id(t)] = t
                places.setdefault(id(t), []).append(_Place(node, str(node.target), rel))
        elif node.op == "get_attr" and str(node.target) in an.param_reads:
            read = _tensor_at(model, str(node.target))
            if read is not None:
                tensors[id(read)] = read
                places.setdefault(id(read), []).append(_Place(node))
    probes = _Probes(an)
    for tid, where in places.items():
        if len(where) < 2:
            continue
        tensor = tensors[tid]
        per_place = [probes.dims(p, tensor) for p in where]
        for d, size in enumerate(tensor.shape):
            if size <= 1:
                continue
            found = [dims[d] for dims in per_place]
            known = [x for x in found if isinstance(x, tuple)]
            node = where[0].node
            ctx = OpContext(an, node)
            if len(known) < len(found):
                reason = (f"a tensor used at several places ({_describe(where)}) has a dim {d} "
                          "that a module there sizes with no symbol, or with several")
                for dim in known:
                    ctx.fix(dim, reason)
                continue
            try:
                ctx.unify(*known)
            except Unsupported:
                for dim in known:
                    ctx.fix(dim, f"a tensor used at several places ({_describe(where)}) is "
                                 f"sized differently at each along dim {d}")
        if any(p.leaf is not None for p in where):
            for p in where:
                if p.leaf is None:
                    an.drop_parameter_member(str(p.node.target))


def _describe(where: list[_Place]) -> str:
    return ", ".join(f"{p.leaf}.{p.rel}" if p.leaf is not None else str(p.node.target)
                     for p in where)


def _named_tensors(mod: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from mod.named_parameters(remove_duplicate=False)
    yield from mod.named_buffers(remove_duplicate=False)


def _tensor_at(model: Submodules, target: str) -> torch.Tensor | None:
    owner, _, name = target.rpartition(".")
    try:
        mod = model(owner)
    except AttributeError:
        return None
    return own_tensor(mod, name)


def own_tensor(mod: nn.Module, name: str) -> torch.Tensor | None:
    """The parameter or buffer ``mod`` registers as ``name`` itself (not in a child)."""
    for pname, p in mod.named_parameters(recurse=False, remove_duplicate=False):
        if pname == name:
            return p
    for bname, b in mod.named_buffers(recurse=False, remove_duplicate=False):
        if bname == name:
            return b
    return None


class _Probes:
    """Which symbol of a leaf sizes which dim of each of its tensors, found by running the
    leaf's resize rule on meta copies (one run per symbol, cached per leaf)."""

    def __init__(self, an: AnalyzerState) -> None:
        self.an = an
        self._probes: dict[str, dict[str, Probe]] = {}

    def dims(self, place: _Place, tensor: torch.Tensor) -> list[Any]:
        """Per dim of ``tensor`` at ``place``: the Dim sizing it there, or ``_PIN``."""
        if place.leaf is None:
            layout = self.an.param_reads[str(place.node.target)]
            if not isinstance(layout, TensorLayout):
                return [_PIN] * tensor.dim()
            return list(layout)
        probed = self._probe(place.leaf)
        shape = tuple(tensor.shape)
        out: list[Any] = []
        for d, size in enumerate(shape):
            sizers: list[tuple[int, int, Dim] | None] = []
            for result in probed.values():
                if result is None:  # a rule that could not be probed may size anything
                    sizers.append(None)
                    continue
                shapes, drop, dim = result
                new = shapes.get(place.rel)
                if new is None or len(new) != len(shape):
                    sizers.append(None)
                elif new[d] != size:
                    sizers.append((size - new[d], drop, dim))
            only = sizers[0] if len(sizers) == 1 else None
            if only is not None and only[0] == only[1] and dim_size(only[2]) == size:
                out.append(only[2])
            else:
                out.append(_PIN)
        return out

    def _probe(self, leaf: str) -> dict[str, Probe]:
        known = self._probes.get(leaf)
        if known is not None:
            return known
        an = self.an
        mod = an.model_modules(leaf)
        described = mod in an.symmap
        name = an.symmap.name_of(mod) if described else leaf
        entry = an.registry.sym_info_entry(type(mod))
        result: dict[str, Probe] = {}
        if entry is None or entry.resize is None or not described:
            result["<no resize rule>"] = None
        else:
            for sname in an.symmap[mod]:
                dim = an.symbol_dims.get((name, sname))
                if dim is None:
                    continue
                result[sname] = _run_rule(entry, mod, sname, dim, an)
        self._probes[leaf] = result
        return result


def _run_rule(entry: SymInfoEntry, mod: nn.Module, sname: str, dim: Dim,
              an: AnalyzerState) -> Probe:
    """Shapes of ``mod``'s tensors after its rule keeps all but the last unit of ``sname``."""
    last = dim[-1]
    drop = 1 if last.group is None else last.length // an.table.units[an.table.find(last.group)]
    keep = dim_size(dim) - drop
    if keep < 1 or drop < 1:
        return None
    clone = meta_copy(mod)
    assert entry.resize is not None
    try:
        entry.resize(clone, sname, torch.arange(keep))
    except Exception:
        return None
    return {rel: tuple(t.shape) for rel, t in _named_tensors(clone)}, drop, dim


__all__ = ["own_tensor", "tie_shared_tensors"]
