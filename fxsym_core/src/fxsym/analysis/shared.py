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

A module of a known family that the graph never calls can hold such a tensor too (T5's
``shared`` embedding, whose weight the encoder's and decoder's ``embed_tokens`` hold): a resize
of the tensor elsewhere changes it as well, so its symbols join the groups of the dims they size
and its own rule keeps its attributes (``embedding_dim``) in line with its tensors. What sizes
what is found the same way, its rule run on meta copies keeping all but the last unit of each
dim. It joins only if every dim of every such tensor it holds is sized by exactly one of its
symbols; else it is left out, as a module outside the graph always was.

A module whose class overrides ``forward`` and so loses its family's SymInfo (a scaled
embedding, Falcon's ``Linear``) is traced into: its tensors are parameter members, sliced
directly, and its family's rule does not run; nor does it for a module of a known family whose
tensors the graph reads without calling it. The size attributes that rule would set
(``embedding_dim``, ``in_features``) become attribute members ``(module, "attr:name")`` of the
dims they follow, found by running the rule on meta copies: an int attribute that equals a
dim's length and that the rule, keeping all but the dim's last unit, sets to the entries kept.
A resize then sets it to the entries kept, so the module's attributes agree with its tensors.

The groups are tied through :class:`~fxsym.analysis.context.OpContext`, as an op rule ties
them; the symbol dims and attribute members found are returned (:class:`SharedMembers`) for
the analyzer to record.
"""

from __future__ import annotations

import weakref
from collections import ChainMap
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

import torch
import torch.fx
from torch import nn

from ..registry import Registry, SymInfoEntry
from ..symbols import ATTRIBUTE_PREFIX, SymMap
from ..tracer.meta import meta_copy
from .context import AnalysisState, OpContext, Unsupported
from .layout import Dim, Layout, TensorLayout, dim_size
from .submodules import Submodules


class AnalyzerState(AnalysisState, Protocol):
    """What tying shared tensors needs of the analyzer
    (:class:`fxsym.analysis.analyzer.Analyzer`, which imports this module)."""

    gm: torch.fx.GraphModule
    symmap: SymMap
    registry: Registry
    param_reads: dict[str, Layout]
    #: the model's submodules by path
    model_modules: Submodules

    @property
    def symbol_dims(self) -> Mapping[tuple[str, str], Dim]:
        """(module qualname, symbol name) -> the Dim that symbol sizes, as found so far."""

    def drop_parameter_member(self, target: str) -> None: ...


@dataclass
class SharedMembers:
    """What :func:`tie_shared_tensors` found, for the analyzer to record: the dims of the
    symbols of modules the graph never calls that hold shared tensors, and of the attribute
    members following their tensors (``param_members``: those keys, sliced directly)."""

    symbol_dims: dict[tuple[str, str], Dim] = field(default_factory=dict)
    param_members: set[tuple[str, str]] = field(default_factory=set)

#: a dim that no symbol of a leaf sizes, or that several size: it pins what meets it
_PIN = "pin"

#: what a probe of one symbol found: the leaf's tensor shapes after its rule kept all but one
#: unit, that unit's length in entries, and the symbol's Dim (``None``: the rule failed)
Probe = tuple[dict[str, tuple[int, ...]], int, Dim] | None


class _Place(NamedTuple):
    """One way the graph reaches a tensor: through a leaf (``rel`` inside it) or ``get_attr``
    (a named tuple: one is made for every tensor of every leaf)."""

    node: torch.fx.Node
    leaf: str | None = None
    rel: str = ""


def tie_shared_tensors(an: AnalyzerState) -> SharedMembers:
    """Unify, dim by dim, what sizes each tensor at each of its places (see the module doc);
    return the symbol dims and members found, which ``an`` does not hold yet."""
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
    outside = [(q, m) for q, m in an.symmap.model.named_modules()
               if q not in leaves and not _in_leaf(q, leaves)]
    holders = _holders(an, leaves, outside, places)
    held = {id(t) for *_, own in holders for _, t in own}
    probes = _Probes(an)
    tied: dict[int, dict[int, Dim]] = {}
    for tid, where in places.items():
        if len(where) < 2 and tid not in held:
            continue
        tensor = tensors[tid]
        per_place = [probes.dims(p, tensor) for p in where]
        tied[tid] = {}
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
                tied[tid][d] = ctx.unify(*known)
            except Unsupported:
                for dim in known:
                    ctx.fix(dim, f"a tensor used at several places ({_describe(where)}) is "
                                 f"sized differently at each along dim {d}")
        if any(p.leaf is not None for p in where):
            for p in where:
                if p.leaf is None:
                    an.drop_parameter_member(str(p.node.target))
    members = SharedMembers()
    for name, mod, entry, snames, own in holders:
        _join(an, name, mod, entry, snames, own, places, tied, members)
    _follow_family_attributes(an, outside, tied, members)
    return members


def _in_leaf(qualname: str, leaves: set[str]) -> bool:
    """Whether the module at ``qualname`` sits inside one of ``leaves``."""
    while "." in qualname:
        qualname = qualname.rpartition(".")[0]
        if qualname in leaves:
            return True
    return False


def _follow_family_attributes(an: AnalyzerState, outside: list[tuple[str, nn.Module]],
                              tied: dict[int, dict[int, Dim]], found: SharedMembers) -> None:
    """The size attributes of modules among ``outside`` (neither leaves nor inside one)
    that override their family's ``forward`` become attribute members of the dims of their own
    tensors they follow (module doc), added to ``found``."""
    symbol_dims = ChainMap(found.symbol_dims, dict(an.symbol_dims))
    followers: list[tuple[str, nn.Module, SymInfoEntry, list[str]]] = []
    for qualname, mod in outside:
        entry = an.registry.sym_info_entry(type(mod))
        if entry is None:
            base = an.registry.shadowed_base(type(mod))
            entry = an.registry.sym_info_entry(base) if base is not None else None
        if entry is None or entry.resize is None:
            continue
        name = an.symmap.name_of(mod) if mod in an.symmap else qualname
        try:
            snames = list(an.symmap[mod] if mod in an.symmap else entry.factory(mod).symbols)
        except Exception:  # a family's SymInfo that does not fit this subclass: left alone
            continue
        if not any((name, sname) in symbol_dims for sname in snames):  # no rule runs
            followers.append((name, mod, entry, snames))
    if not followers:
        return
    known = dict(tied)
    for target, layout in an.param_reads.items():
        t = _tensor_at(an.model_modules, target)
        if t is not None and id(t) not in known and isinstance(layout, TensorLayout):
            known[id(t)] = dict(enumerate(layout))
    ctx = OpContext(an, next(iter(an.gm.graph.nodes)))
    added: set[tuple[str, str]] = set()
    for name, mod, entry, snames in followers:
        results: dict[int, dict[str, _RuleResult | None]] = {}  # by entries kept
        for rel, t in _own_tensors(mod):
            for d, dim in known.get(id(t), {}).items():
                for attr in _following(an, entry, mod, snames, rel, tuple(t.shape), d, dim,
                                       results):
                    key = (name, f"{ATTRIBUTE_PREFIX}{attr}")
                    old = symbol_dims.get(key)
                    if old is not None and key not in added:
                        continue  # read as a size by the traced forward: already a member
                    try:
                        symbol_dims[key] = dim if old is None else ctx.unify(old, dim)
                    except Unsupported:
                        continue
                    found.param_members.add(key)
                    added.add(key)


def _following(an: AnalyzerState, entry: SymInfoEntry, mod: nn.Module, snames: list[str],
               rel: str, shape: tuple[int, ...], d: int, dim: Dim,
               results: dict[int, dict[str, _RuleResult | None]]) -> list[str]:
    """The int attributes of ``mod`` that equal dim ``d`` of its tensor ``rel`` and that the
    one symbol whose rule shrinks that dim (by its last unit, and nothing else of the tensor)
    sets to the entries kept; empty if no symbol or several shrink it. ``results`` keeps the
    rules' results by entries kept, for the module's other tensors and dims."""
    if shape[d] <= 1:
        return []
    keep = shape[d] - _unit_entries(an, dim)
    if keep < 1:
        return []
    if keep not in results:
        results[keep] = _rule_results(entry, mod, snames, keep)
    found = _shrinker(results[keep], rel, shape, d, keep)
    if found is None:
        return []
    before = vars(mod)
    return [a for a, v in found[1].items()
            if v == keep and _is_int(before.get(a)) and before[a] == shape[d]]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _own_tensors(mod: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    yield from mod.named_parameters(recurse=False, remove_duplicate=False)
    yield from mod.named_buffers(recurse=False, remove_duplicate=False)


#: a module outside the graph holding tensors the graph reaches: its name in the SymMap, the
#: module, its family's entry, its symbols and its tensors (relative name, tensor) reached
_Holder = tuple[str, nn.Module, SymInfoEntry, list[str], list[tuple[str, torch.Tensor]]]


def _holders(an: AnalyzerState, leaves: set[str], outside: list[tuple[str, nn.Module]],
             places: dict[int, list[_Place]]) -> list[_Holder]:
    """The modules of a known family (a SymInfo and a resize rule) among ``outside`` (the
    modules neither called as leaves nor inside one) that the graph neither reads from nor
    runs part of, holding tensors in ``places``."""
    symmap = an.symmap
    candidates = [(q, m) for q, m in outside if m in symmap]
    if not candidates:
        return []
    run = {""}  # the modules the graph calls or reads tensors of sit in these
    for path in [*leaves, *(str(n.target) for n in an.gm.graph.nodes if n.op == "get_attr")]:
        while path:
            path = path.rpartition(".")[0]
            if path in run:
                break
            run.add(path)
    out: list[_Holder] = []
    for qualname, mod in candidates:
        if qualname in run:
            continue
        tensors = [(rel, t) for rel, t in _named_tensors(mod) if id(t) in places]
        if not tensors:
            continue
        name = symmap.name_of(mod)
        entry = an.registry.sym_info_entry(type(mod))
        snames = list(symmap[mod])
        if entry is not None and entry.resize is not None and not any(
                (name, sname) in an.symbol_dims for sname in snames):
            out.append((name, mod, entry, snames, tensors))
    return out


def _join(an: AnalyzerState, name: str, mod: nn.Module, entry: SymInfoEntry, snames: list[str],
          tensors: list[tuple[str, torch.Tensor]], places: dict[int, list[_Place]],
          tied: dict[int, dict[int, Dim]], out: SharedMembers) -> None:
    """Attach the symbols of a holder to the dims of its tensors they size (module doc), if
    each dim is sized by one of them: their dims go to ``out``."""
    dims: dict[str, list[Dim]] = {}
    for rel, t in tensors:
        sizers = _sizers(an, entry, mod, snames, rel, t, tied.get(id(t), {}))
        if sizers is None:
            return
        for d, sname in sizers.items():
            dims.setdefault(sname, []).append(tied[id(t)][d])
    ctx = OpContext(an, places[id(tensors[0][1])][0].node)
    for sname, found in dims.items():
        try:
            out.symbol_dims[(name, sname)] = ctx.unify(*found)
        except Unsupported:
            for dim in found:
                ctx.fix(dim, f"{name}.{sname} sizes tensors held elsewhere that are sized "
                             "differently there")


def _sizers(an: AnalyzerState, entry: SymInfoEntry, mod: nn.Module, snames: list[str],
            rel: str, tensor: torch.Tensor, dims: dict[int, Dim]) -> dict[int, str] | None:
    """Per dim of size > 1 of ``tensor``, held by ``mod`` as ``rel``, that is tied as ``dims``
    (the others are pinned where the graph reaches the tensor: never resized): the one symbol
    of ``mod`` whose rule, keeping all but the dim's last unit, shrinks that dim by that unit
    and nothing else of the tensor. ``None`` if a dim has no such symbol or several, or a
    symbol's rule fails on every dim (it could size any of them). A rule failing on one dim
    only cannot be keeping fewer entries of it: it sizes a shorter one."""
    shape = tuple(tensor.shape)
    wanted = [d for d, size in enumerate(shape) if size > 1 and d in dims]
    keep: dict[int, int] = {}
    results: dict[int, dict[str, _RuleResult | None]] = {}  # by entries kept
    for d in wanted:
        keep[d] = shape[d] - _unit_entries(an, dims[d])
        if keep[d] < 1:
            return None
        if keep[d] not in results:
            results[keep[d]] = _rule_results(entry, mod, snames, keep[d])

    def fails(sname: str, d: int) -> bool:
        result = results[keep[d]][sname]
        return result is None or rel not in result[0]

    if any(all(fails(sname, d) for d in wanted) for sname in snames):
        return None
    out: dict[int, str] = {}
    for d in wanted:
        found = _shrinker(results[keep[d]], rel, shape, d, keep[d])
        if found is None:
            return None
        out[d] = found[0]
    return out


def _shrinker(results: dict[str, _RuleResult | None], rel: str, shape: tuple[int, ...],
              d: int, keep: int) -> tuple[str, dict[str, Any]] | None:
    """Among the rules' ``results`` (by symbol, each keeping ``keep`` entries), the one symbol
    whose rule changes dim ``d`` of tensor ``rel`` (of ``shape``), or its number of dims, and
    the int attributes its copy holds after; ``None`` if none or several do, or the one does
    more than shrink dim ``d`` to ``keep`` entries."""
    changed: list[tuple[str, tuple[int, ...], dict[str, Any]]] = []
    for sname, result in results.items():
        if result is None:
            continue
        new = result[0].get(rel)
        if new is not None and (len(new) != len(shape) or new[d] != shape[d]):
            changed.append((sname, new, result[1]))
    if len(changed) != 1:
        return None
    sname, new, attrs = changed[0]
    return (sname, attrs) if new == (*shape[:d], keep, *shape[d + 1:]) else None


def _unit_entries(an: AnalyzerState, dim: Dim) -> int:
    """The entries of one unit of ``dim``'s last segment."""
    last = dim[-1]
    return 1 if last.group is None else last.length // an.table.units[an.table.find(last.group)]


#: what a family's rule leaves on a meta copy: its tensor shapes by relative name, and its
#: int attributes
_RuleResult = tuple[dict[str, tuple[int, ...]], dict[str, Any]]


def _rule_results(entry: SymInfoEntry, mod: nn.Module, snames: list[str], keep: int
                  ) -> dict[str, _RuleResult | None]:
    """Per symbol of ``snames``: what ``entry``'s rule, keeping ``keep`` entries of it on a
    meta copy of ``mod``, leaves (:data:`_RuleResult`); ``None`` if the rule fails.

    A symbol that follows another of the module (:meth:`Symbol.link_to`: a depthwise conv's
    output channels follow its input channels) changes with it: the rules of the symbols
    following a free one run on its copy too, and the result is the free one's alone."""
    assert entry.resize is not None
    followers = _followers(entry, mod, snames)
    out: dict[str, _RuleResult | None] = {}
    for sname in snames:
        if any(sname in f for f in followers.values()):
            out[sname] = None
            continue
        clone = meta_copy(mod)
        try:
            for name in (sname, *followers.get(sname, ())):
                entry.resize(clone, name, torch.arange(keep))
        except Exception:  # any failure of a rule on a copy: it cannot keep that many entries
            out[sname] = None
            continue
        attrs = {k: v for k, v in vars(clone).items() if not k.startswith("_") and _is_int(v)}
        out[sname] = {rel: tuple(t.shape) for rel, t in _named_tensors(clone)}, attrs
    return out


def _followers(entry: SymInfoEntry, mod: nn.Module, snames: list[str]) -> dict[str, list[str]]:
    """By symbol of ``snames``, the others of ``snames`` that follow it in ``mod``'s SymInfo."""
    try:
        symbols = entry.factory(mod).symbols
    except Exception:  # a family's SymInfo that does not fit this module: no links known
        return {}
    names = {id(sym): name for name, sym in symbols.items() if name in snames}
    out: dict[str, list[str]] = {}
    for name, sym in symbols.items():
        if name in snames and sym.parent is not None and id(sym.parent) in names:
            out.setdefault(names[id(sym.parent)], []).append(name)
    return out


def _describe(where: list[_Place]) -> str:
    return ", ".join(f"{p.leaf}.{p.rel}" if p.leaf is not None else str(p.node.target)
                     for p in where)


def _named_tensors(mod: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    if not mod._modules and _walks_as_module(type(mod)):
        # a module without children, listed the way nn.Module lists its own tensors
        yield from ((k, p) for k, p in mod._parameters.items() if p is not None)
        yield from ((k, b) for k, b in mod._buffers.items() if b is not None)
        return
    yield from mod.named_parameters(remove_duplicate=False)
    yield from mod.named_buffers(remove_duplicate=False)


#: what ``named_parameters``/``named_buffers`` go through
_WALKS = ("named_parameters", "named_buffers", "_named_members", "named_modules")


_PLAIN_WALKS: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def _walks_as_module(cls: type) -> bool:
    """Whether ``cls`` lists its tensors the way ``nn.Module`` does (it overrides none of
    :data:`_WALKS`), remembered per class."""
    known = _PLAIN_WALKS.get(cls)
    if known is None:
        known = _PLAIN_WALKS[cls] = all(getattr(cls, f) is getattr(nn.Module, f) for f in _WALKS)
    return known


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


__all__ = ["SharedMembers", "own_tensor", "tie_shared_tensors"]
