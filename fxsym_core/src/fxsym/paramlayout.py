"""Where the units of every group lie in the model's parameters: the :class:`Layout`.

A unit of a group (a channel, an attention head) lives in many tensors: the rows its producers
write, the columns its consumers read, the scales of the norms between them, parameters used
directly in the graph. The layout says, for every parameter and dim, which slices belong to
which unit of which group; importance criteria sum over them and plans count parameters with
them.

**Derived from the analysis, in the size of the metadata.** ``analysis.symbol_dims`` gives,
for every member of a group, the segments of the dimension it sizes (``dim_index`` of
:mod:`fxsym.resizing` turns units kept into entries kept, exactly as a resize does):

* a *parameter member* (``"weight:0"``) is that dim of that parameter: its layout is read off
  the segments, nothing runs;
* a *symbol* of a module is resized by its family's rule, which the core cannot read. The rule
  runs on a copy of that one module whose parameters and buffers are meta tensors (no weight
  is read or copied), under :func:`~fxsym.resizing.observe_keeps`: every
  :func:`~fxsym.resizing.keep_entries` it makes says which entries of which parameter dim it
  keeps. Keeping subsets of units chosen so that the slices surviving spell, bit by bit, the
  unit of each slice (``⌈log2(units + 1)⌉`` calls per group of the symbol) gives the unit of
  every slice. A rule that keeps, in the first two calls, exactly the entries it is given along
  every dim it changes (a projection, a norm; no dim at all: a depthwise conv's
  ``in_channels``) needs no more calls: slice ``i`` is entry ``i``,
  whose unit the segments say; once a module has shown that, the others of its kind (class,
  rule, symbol, what they hold, sizes left out: the convs of a CNN) need one call each, which
  must keep exactly the entries given along the dims a module of the kind was shown to keep
  (else they are decoded in full). Modules whose rules and state are alike (the layers of a
  transformer) are run once: the result is reused for every module with the same class,
  symbol, segments, parameter shapes and plain attributes.

A rule that changes a parameter another way (its own ``index_select``, a new tensor) or cannot
run on meta tensors is run again on a copy of its module holding *probes* (each element its own
flat index, sized like the module's parameters) and read from the values that survive; if that
cannot tell either, :class:`~fxsym.errors.PlanError`.

:func:`probe_layout` is the reference: trial resizes of whole-model probe copies, with no
knowledge of the analysis' segments, in ``O(copies of the model)``. The tests compare the two
on model zoos.

The warnings of trial runs (a plugin's "the config does not describe the resized model") are
about throw-away copies and are not shown.

Imports from fxsym: errors, modstate, resizing, symbols.
"""

from __future__ import annotations

import copy
import math
import warnings
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import torch
from torch import nn

from .errors import PlanError
from .modstate import ModuleTreeState, computed_tensors
from .resizing import dim_index, observe_keeps, resize
from .symbols import GroupIndex, Segment, SymGroup, SymMap

__all__ = ["Layout", "Slices", "layout", "probe_layout"]


@dataclass(frozen=True)
class Slices:
    """The slices of parameter ``param`` along ``dim`` that belong to units of one group:
    slice ``index[i]`` belongs to unit ``unit[i]``."""

    param: str
    dim: int
    index: torch.Tensor
    unit: torch.Tensor


@dataclass(frozen=True)
class Layout:
    """Where the units of every searchable group lie in the model's parameters.

    ``shapes`` holds every parameter of the model (a shared one under its first name);
    ``slices`` the slices of each group of size 2 or more (a group without any parameter
    slice has an empty list), in the order of the parameters and their dims; ``sizes`` the
    units of every group.
    """

    shapes: Mapping[str, tuple[int, ...]]
    slices: Mapping[str, Sequence[Slices]]
    sizes: Mapping[str, int]

    def shapes_after(self, kept: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape once each group of ``kept`` keeps that many units.

        A slice stays if every group it belongs to keeps its unit; groups cutting one dim side
        by side (a concatenation) or crosswise (heads x head dims of one projection) are both
        counted exactly, whichever units are kept."""
        return {**self.shapes, **self.changed_shapes(kept)}

    def changed_shapes(self, kept: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """The parameters :meth:`shapes_after` changes, with their new shapes (in the size of
        the groups' slices, not of the model).

        A dim one group cuts, with as many slices per unit, keeps ``slices / units x kept``
        of them (counted); a dim several groups cut keeps the sum, over its slices, of the
        product of the shares each group keeps (``kept / units``) of the slice."""
        cuts: dict[tuple[str, int], list[tuple[Slices, int, int]]] = {}
        for group, count in kept.items():
            size = self.sizes[group]
            if count == size:
                continue
            for s in self.slices.get(group, ()):
                cuts.setdefault((s.param, s.dim), []).append((s, count, size))
        shapes: dict[str, list[int]] = {}
        for (param, dim), parts in cuts.items():
            length = self.shapes[param][dim]
            s, count, size = parts[0]
            n = s.index.numel()
            if len(parts) == 1 and n % size == 0:
                left = length - n + n // size * count
            else:
                share = torch.ones(length, dtype=torch.float64)
                for s, count, size in parts:
                    share.index_copy_(0, s.index, share.index_select(0, s.index) * (count / size))
                left = round(float(share.sum()))
            shapes.setdefault(param, list(self.shapes[param]))[dim] = left
        return {name: tuple(shape) for name, shape in shapes.items()}

    def param_count(self, kept: Mapping[str, int]) -> int:
        """How many parameters the model holds once each group of ``kept`` keeps that many
        units (the others unchanged)."""
        return sum(math.prod(s) for s in self.shapes.values()) - sum(
            math.prod(self.shapes[p]) - math.prod(s) for p, s in self.changed_shapes(kept).items())


_LAYOUTS: weakref.WeakKeyDictionary[SymMap, Layout] = weakref.WeakKeyDictionary()


def layout(model: nn.Module, symmap: SymMap) -> Layout:
    """The :class:`Layout` of ``model`` as analyzed in ``symmap`` (computed once per SymMap).

    Raises :class:`~fxsym.errors.PlanError` when a resize rule does something other than
    keeping slices of parameters (nothing would say where the units are).
    """
    _check(model, symmap)
    cached = _LAYOUTS.get(symmap)
    if cached is None:
        with warnings.catch_warnings():  # of trial resizes of copies: the real resize says it
            warnings.simplefilter("ignore")
            cached = _LAYOUTS[symmap] = _Deriver(model, symmap).layout()
    return cached


def _check(model: nn.Module, symmap: SymMap) -> None:
    if symmap.model is not model:
        raise PlanError("this SymMap was computed for another model; call fxsym.analyze(model)")
    if symmap.is_stale:
        raise PlanError("the model was resized since this SymMap was computed; analyze again")


# -- the direct derivation ------------------------------------------------------------------
#: one parameter a module holds: (submodule path, attribute, the model's name for it)
_Slot = tuple[str, str, str]
#: what one trial run left: per changed slot and dim, the slices kept in order (a meta copy)
#: or a mask of those that survived (a probe copy)
_Trial = dict[tuple[str, int], torch.Tensor]


class _Dim(NamedTuple):
    """A member's dimension (``dim``, its segments) and the group decoded along it; ``key``
    (the group's size and the segments' layout relative to it) is all its entries and their
    units depend on."""

    dim: Sequence[Segment]
    table: GroupIndex
    group: SymGroup
    key: Any


class _Opaque(Exception):
    """A rule did something the keep observer cannot follow (run it on probes instead)."""


class _Deriver:
    """One layout computation: the model's parameters, their meta stand-ins, and the results
    of rule runs by module signature."""

    def __init__(self, model: nn.Module, symmap: SymMap) -> None:
        self.symmap = symmap
        self.params = dict(model.named_parameters())
        self.first = {id(p): n for n, p in self.params.items()}
        self.modules = dict(model.named_modules())
        self.standins: dict[int, Any] = {}
        for t in self.params.values():
            self.standins[id(t)] = nn.Parameter(torch.empty(t.shape, dtype=t.dtype,
                                                            device="meta"),
                                                requires_grad=t.requires_grad)
        for _, b in model.named_buffers():
            self.standins[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="meta")
        self.standin_ids = {id(s) for s in self.standins.values()}
        self.memo_base: dict[int, Any] = {**computed_tensors(model, meta=True),
                                          **self.standins}
        self.cache: dict[Any, dict[tuple[str, int], torch.Tensor]] = {}
        self.clones: dict[int, tuple[nn.Module, ModuleTreeState]] = {}
        #: per module: its slots, its signature and its kind (:func:`_signature`), these two
        #: by their number in ``ids``
        self.modinfo: dict[int, tuple[list[_Slot], int | None, int | None]] = {}
        self.ids: dict[Any, int] = {}
        #: per kind of module and symbol, the sets of dims its rules were shown to keep entry
        #: for entry (a depthwise conv's ``in_channels`` none, another conv's its columns)
        self.kinds: dict[Any, set[frozenset[tuple[str, int]]]] = {}
        #: the entries each trial keeps, and the unit of each entry, per :attr:`_Dim.key`
        self.indices: dict[Any, torch.Tensor] = {}
        self.entries: dict[Any, torch.Tensor] = {}

    def layout(self) -> Layout:
        symmap, analysis = self.symmap, self.symmap.analysis
        shapes = {name: tuple(p.shape) for name, p in self.params.items()}
        groups = symmap.groups()
        sizes = {g.name: g.size for g in groups}
        live = {g.id: g for g in groups if g.size >= 2}
        if not live:
            return Layout(shapes, {}, sizes)
        if analysis is None:
            raise PlanError("the SymMap holds no analysis; compute it with fxsym.analyze")
        table = analysis.table
        units: dict[tuple[int, str, int], torch.Tensor] = {}
        for (qualname, sname), dim in analysis.symbol_dims.items():
            roots = [r for r in dict.fromkeys(table.find(s.group) for s in dim
                                              if s.group is not None) if r in live]
            mod = self.modules.get(qualname)
            if not roots or mod is None:
                continue
            for root in roots:
                if (qualname, sname) in analysis.param_members:
                    found = self._member_units(mod, sname, dim, table, root)
                else:
                    found = self._rule_units(mod, qualname, sname, dim, table, live[root])
                for (name, d), u in found.items():
                    _merge(units, (root, name, d), u, live[root].name)
        slices: dict[str, list[Slices]] = {g.name: [] for g in live.values()}
        order = {name: i for i, name in enumerate(self.params)}
        for root, name, d in sorted(units, key=lambda k: (order[k[1]], k[2], k[0])):
            u = units[(root, name, d)]
            at = (u >= 0).nonzero().flatten()
            if at.numel():
                slices[live[root].name].append(Slices(name, d, at, u.index_select(0, at)))
        return Layout(shapes, slices, sizes)

    def _member_units(self, mod: nn.Module, sname: str, dim: Sequence[Segment],
                      table: GroupIndex, root: int) -> dict[tuple[str, int], torch.Tensor]:
        """A parameter member ``"name:dim"``: its units read off the segments."""
        pname, _, d = sname.rpartition(":")
        name = self.first.get(id(getattr(mod, pname, None)))
        if not d.isdigit() or name is None:  # an attribute, or a buffer
            return {}
        length = self.params[name].shape[int(d)]
        u = _entry_units(dim, table, root)
        if u.numel() != length:
            raise PlanError(f"{name} has {length} entries along dim {d}, the analysis "
                            f"{u.numel()}: analyze the model again")
        return {(name, int(d)): u}

    def _rule_units(self, mod: nn.Module, qualname: str, sname: str, dim: Sequence[Segment],
                    table: GroupIndex, group: SymGroup) -> dict[tuple[str, int], torch.Tensor]:
        """A symbol of a module: where its resize rule puts the units of ``group``, by trial
        runs on a meta copy of the module (else on a probe copy), reused for alike modules."""
        entry = self.symmap.registry.sym_info_entry(type(mod))
        if entry is None or entry.resize is None:
            raise PlanError(f"no resize rule for {type(mod).__name__} ({qualname}.{sname})")
        rule = entry.resize
        found = self.modinfo.get(id(mod))
        if found is None:  # signatures stand for themselves as small ints: hashed once
            slots = self._slots(mod)
            signature, kind = _signature(mod, slots)
            found = self.modinfo[id(mod)] = (
                slots, None if signature is None else self.ids.setdefault(signature, len(self.ids)),
                None if kind is None else self.ids.setdefault(kind, len(self.ids)))
        slots, signature, kind = found
        root = group.id
        layout_of_dim = tuple((s.units, s.block, None if s.group is None else
                               table.find(s.group) == root) for s in dim)
        key = (rule, sname, group.size, layout_of_dim, signature)
        rel = self.cache.get(key) if signature is not None else None
        if rel is None:
            at = _Dim(dim, table, group, (group.size, layout_of_dim))
            alike = None if kind is None else (rule, sname, kind)
            rel = self._decode(mod, sname, at, rule, slots, meta=True, alike=alike)
            if rel is None:
                rel = self._decode(mod, sname, at, rule, slots, meta=False)
            if rel is None:
                raise PlanError(f"cannot tell where the units of {group.name} lie in the "
                                f"parameters of {qualname}: its resize rule ({sname}) does "
                                "more than keep slices of them")
            if signature is not None:
                self.cache[key] = rel
        names = {(sub, pname): name for sub, pname, name in slots}
        return {(names[_split(slot)], d): u for (slot, d), u in rel.items()}

    def _slots(self, mod: nn.Module) -> list[_Slot]:
        out: list[_Slot] = []
        for sub, m in mod.named_modules(remove_duplicate=False):
            for pname, p in m.named_parameters(recurse=False, remove_duplicate=False):
                name = self.first.get(id(p))
                if name is not None:
                    out.append((sub, pname, name))
        return out

    def _decode(self, mod: nn.Module, sname: str, at: _Dim, rule: Callable[..., None],
                slots: Sequence[_Slot], meta: bool, alike: Any = None
                ) -> dict[tuple[str, int], torch.Tensor] | None:
        """Unit ``u`` is coded ``u + 1``; trial ``k`` keeps the units whose code has bit ``k``
        clear. The code of a slice is the set of trials it did not survive (``None``: the
        rule cannot be followed this way).

        A rule that kept, in the first two trials, exactly the entries it was given along
        every dim it changed, the same dims both times (a projection's rows or columns, a
        norm's scales; none for a depthwise conv's ``in_channels``, whose rows go with
        ``out_channels``), keeps entry ``i`` as slice ``i``: its slices' units are the
        entries' units, read off the segments without the other trials. Once a module of a
        kind (``alike``: the rule, the symbol, what the module holds, sizes left out) has
        shown that in two trials, the first trial suffices for the others of its kind: if it
        keeps exactly the entries given along the dims some module of the kind was shown to
        keep, the second is taken as said; if not, the module is decoded in full."""
        group = at.group
        codes: dict[tuple[str, int], torch.Tensor] = {}
        same: frozenset[tuple[str, int]] | None = None  # the dims kept entry for entry so far
        follows = meta  # every trial so far kept exactly the entries given, on the dims `same`
        shown = self.kinds.setdefault(alike, set()) if meta and alike is not None else set()
        trials: list[_Trial] = []
        for k in range(group.size.bit_length()):
            index = self._index(at, k)
            try:
                trials.append(self._trial(mod, sname, index.clone(), rule, slots, meta))
            except _Opaque:
                return None
            except Exception as exc:
                if meta:
                    return None
                raise PlanError(f"cannot map the units of {group.name} onto the parameters: a "
                                f"trial resize of {type(mod).__name__}.{sname} failed: "
                                f"{exc}") from exc
            if follows and k < 2:
                lines = trials[-1]
                exact = frozenset(key for key, line in lines.items() if torch.equal(line, index))
                follows = len(exact) == len(lines) and same in (None, exact)
                same = exact
                if follows and k == 1:
                    shown.add(exact)
                if follows and (k == 1 or exact in shown):
                    return {key: self._padded(at, slots, key) for key in exact}
        for k, survivors in enumerate(trials):
            for (slot, d), survived in survivors.items():
                if meta:  # the entries kept, in order: which of them survived
                    survived = _mask(survived, self.params[_slot_name(slots, slot)].shape[d])
                code = codes.get((slot, d))
                if code is None:
                    code = codes[(slot, d)] = torch.zeros(survived.numel(), dtype=torch.long)
                code |= (~survived).long() << k
        out: dict[tuple[str, int], torch.Tensor] = {}
        for key, code in codes.items():
            u = code - 1
            if int(u.max()) >= group.size:
                return None
            out[key] = u
        return out

    def _index(self, at: _Dim, k: int) -> torch.Tensor:
        """The entries trial ``k`` keeps along ``at``: those of the units whose code (unit
        ``u`` is coded ``u + 1``) has bit ``k`` clear."""
        index = self.indices.get((at.key, k))
        if index is None:
            code_of_unit = torch.arange(1, at.group.size + 1)
            kept = ((code_of_unit >> k) & 1 == 0).nonzero().flatten()
            index = self.indices[(at.key, k)] = dim_index(at.table, at.dim, {at.group.id: kept})
        return index

    def _padded(self, at: _Dim, slots: Sequence[_Slot], key: tuple[str, int]) -> torch.Tensor:
        """The units of the entries along ``at`` as those of the slices of ``key`` (a slot and
        dim kept entry for entry; slices past the entries belong to no unit)."""
        units = self.entries.get(at.key)
        if units is None:
            units = self.entries[at.key] = _entry_units(at.dim, at.table, at.group.id)
        extra = self.params[_slot_name(slots, key[0])].shape[key[1]] - units.numel()
        return torch.cat([units, torch.full((extra,), -1, dtype=torch.long)]) if extra else units

    def _trial(self, mod: nn.Module, sname: str, index: torch.Tensor,
               rule: Callable[..., None], slots: Sequence[_Slot], meta: bool) -> _Trial:
        """Run ``rule`` on a copy of ``mod`` keeping ``index``; per changed slot
        (``"sub/param"``) and dim: on a meta copy, the slices kept, in order; on a probe copy,
        which slices survived (a bool mask)."""
        if meta:  # one copy per module, put back after each trial as a resize would be
            found = self.clones.get(id(mod))
            if found is None:
                found = self.clones[id(mod)] = _clone_of(mod, self.memo_base)
            clone, state = found
            try:
                return self._run(clone, sname, index, rule, slots, None)
            finally:
                state.restore()
        memo = dict(self.memo_base)
        probes: dict[int, torch.Tensor] = {}
        for _, _, name in slots:
            p = self.params[name]
            probe = nn.Parameter(torch.arange(p.numel(), dtype=_probe_dtype(p)).reshape(
                p.shape), requires_grad=False)
            memo[id(p)] = probes.setdefault(id(p), probe)
        return self._run(copy.deepcopy(mod, memo), sname, index, rule, slots, probes)

    def _run(self, clone: nn.Module, sname: str, index: torch.Tensor,
             rule: Callable[..., None], slots: Sequence[_Slot],
             probes: dict[int, torch.Tensor] | None) -> _Trial:
        """Run ``rule`` on ``clone`` (holding meta stand-ins, or ``probes`` of the module's
        parameters) and read what survived."""
        meta = probes is None
        origins: dict[int, tuple[torch.Tensor, list[torch.Tensor | None]]] = {}

        def observe(old: torch.Tensor, d: int, idx: torch.Tensor, new: torch.Tensor) -> None:
            base = origins.get(id(old))
            if base is None:
                if id(old) not in self.standin_ids:
                    raise _Opaque
                lines: list[torch.Tensor | None] = [None] * old.dim()
            else:
                lines = list(base[1])
            idx = idx.to("cpu", torch.long)
            line = lines[d]
            lines[d] = idx if line is None else line.index_select(0, idx)
            origins[id(new)] = (new, lines)

        if meta:
            with observe_keeps(observe):
                rule(clone, sname, index)
        else:
            rule(clone, sname, index)
        out: _Trial = {}
        for sub, pname, name in slots:
            p = self.params[name]
            before = self.standins[id(p)] if probes is None else probes.get(id(p))
            try:
                t = getattr(clone.get_submodule(sub), pname)
            except AttributeError as exc:
                raise _Opaque from exc
            if t is before:
                continue
            if meta:
                rec = origins.get(id(t))
                if rec is None:
                    raise _Opaque
                out.update(((_join(sub, pname), d), line) for d, line in enumerate(rec[1])
                           if line is not None)
            elif not isinstance(t, torch.Tensor) or t.dim() != p.dim() or (
                    before is None or t.dtype != before.dtype):
                raise PlanError(f"cannot tell where the units lie in {name}: a resize rule "
                                "replaced it instead of keeping slices of it")
            else:
                masks = _survivor_masks(t, tuple(p.shape))
                out.update(((_join(sub, pname), d), m) for d, m in enumerate(masks)
                           if not bool(m.all()))
        return out


def _clone_of(mod: nn.Module, memo_base: Mapping[int, Any]
              ) -> tuple[nn.Module, ModuleTreeState]:
    """``copy.deepcopy(mod, memo)`` (``memo_base`` maps the model's tensors to their meta
    stand-ins), and the copy's state to put back after each trial."""
    clone = _copy_module(mod, dict(memo_base))
    return clone, ModuleTreeState(clone)


_ATOMS = frozenset({int, float, str, bool, type(None)})
_EMPTY = frozenset({dict, OrderedDict, list, set})
_OWN_COPY = ("__deepcopy__", "__getnewargs_ex__", "__getnewargs__")


def _copy_module(mod: nn.Module, memo: dict[int, Any]) -> nn.Module:
    """What ``copy.deepcopy(mod, memo)`` gives, made the way it makes it for an object copied
    by ``object.__reduce_ex__`` (a new object of its class, ``__setstate__`` of a deep copy of
    its ``__getstate__``), without its generic machinery for what a module mostly holds:
    values that are their own copies (numbers, strings, tuples of them), empty containers
    (the hook tables), tensors the memo maps, submodules (copied here, recursively). A module
    whose class copies itself another way, and every other value, go through
    ``copy.deepcopy`` with the same memo."""
    done = memo.get(id(mod))
    if done is not None:
        return done  # type: ignore[no-any-return]
    cls = type(mod)
    state = cast(Any, mod).__getstate__() if cls.__reduce_ex__ is object.__reduce_ex__ and \
        cls.__reduce__ is object.__reduce__ and not isinstance(mod, (list, dict)) and \
        not any(hasattr(cls, a) for a in _OWN_COPY) else None
    if not isinstance(state, dict):
        return copy.deepcopy(mod, memo)
    new = cls.__new__(cls)
    memo[id(mod)] = new
    copied: dict[str, Any] = {}
    for key, value in state.items():
        kind = type(value)
        if kind in _ATOMS or (kind is tuple and all(type(v) in _ATOMS for v in value)):
            copied[key] = value
        elif kind in _EMPTY and not value:
            made = memo.get(id(value))
            if made is None:
                made = memo[id(value)] = kind()
            copied[key] = made
        elif key in ("_parameters", "_buffers", "_modules") and kind is dict:
            one = _copy_module if key == "_modules" else copy.deepcopy
            copied[key] = {k: None if v is None else one(v, memo) for k, v in value.items()}
        else:
            copied[key] = copy.deepcopy(value, memo)
    if hasattr(new, "__setstate__"):
        cast(Any, new).__setstate__(copied)
    else:
        vars(new).update(copied)
    return new


def _entry_units(dim: Sequence[Segment], table: GroupIndex, root: int) -> torch.Tensor:
    """Along a dimension laid out as ``dim``: the unit of group ``root`` of each entry (-1 for
    the entries of other groups or of fixed size)."""
    parts = []
    for seg in dim:
        n = seg.units * seg.block
        if seg.group is not None and table.find(seg.group) == root:
            per_unit = max(seg.units // table.units[root], 1)
            parts.append(torch.arange(n) // seg.block // per_unit)
        else:
            parts.append(torch.full((n,), -1, dtype=torch.long))
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)


def _slot_name(slots: Sequence[_Slot], slot: str) -> str:
    sub, pname = _split(slot)
    return next(name for s, p, name in slots if (s, p) == (sub, pname))


def _join(sub: str, pname: str) -> str:
    return f"{sub}/{pname}"


def _split(slot: str) -> tuple[str, str]:
    sub, _, pname = slot.rpartition("/")
    return sub, pname


def _mask(line: torch.Tensor, n: int) -> torch.Tensor:
    return torch.zeros(n, dtype=torch.bool).index_fill_(0, line, True)


def _merge(units: dict[tuple[int, str, int], torch.Tensor], key: tuple[int, str, int],
           u: torch.Tensor, group: str) -> None:
    """Add the units ``u`` of one member to those already found for the same parameter dim
    (a tied parameter is reached from each of its places; they must agree)."""
    have = units.get(key)
    if have is None:
        units[key] = u
        return
    if bool(((have != u) & (have >= 0) & (u >= 0)).any()):
        raise PlanError(f"the members of {group} disagree on which of its units the slices "
                        f"of {key[1]} (dim {key[2]}) belong to")
    units[key] = torch.where(have >= 0, have, u)


_PLAIN = (int, float, str, bool, type(None))


def _signature(mod: nn.Module, slots: Sequence[_Slot]) -> tuple[Any, Any]:
    """What a resize rule of ``mod`` can read: per submodule its class and plain attributes
    (objects held, such as a config, by identity), the shapes of its tensors; and the
    module's *kind*: the same with sizes left out (numbers by their type, tensors by their
    number of dims). ``(None, None)`` when a value cannot be keyed (nothing is reused then)."""
    parts: list[Any] = []
    kinds: list[Any] = []
    try:
        for sub, m in mod.named_modules(remove_duplicate=False):
            state: list[tuple[Any, ...]] = []
            kind: list[tuple[Any, ...]] = []
            for k, v in vars(m).items():
                if k in ("_parameters", "_buffers", "_modules"):
                    continue
                if isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(
                        isinstance(x, _PLAIN) for x in v)):
                    state.append((k, v))
                    kind.append((k, _sizes_left_out(v)))
                elif isinstance(v, (dict, list, set)):
                    if v:
                        return None, None
                else:
                    state.append((k, type(v), id(v)))
                    kind.append(state[-1])
            tensors = [(n, t.shape, t.dtype) for n, t in (
                *m.named_parameters(recurse=False, remove_duplicate=False),
                *m.named_buffers(recurse=False, remove_duplicate=False))]
            parts.append((sub, type(m), tuple(state),
                          tuple((n, tuple(shape), dtype) for n, shape, dtype in tensors)))
            kinds.append((sub, type(m), tuple(kind),
                          tuple((n, len(shape), dtype) for n, shape, dtype in tensors)))
        tied = tuple(name for _, _, name in slots)  # which places share a parameter
        shared = tuple(tied.index(n) for n in tied)
        key = (tuple(parts), shared)
        alike = (tuple(kinds), shared)
        hash(key)
        hash(alike)
    except TypeError:
        return None, None
    return key, alike


def _sizes_left_out(v: Any) -> Any:
    if type(v) in (int, float):
        return type(v)
    return tuple(map(_sizes_left_out, v)) if isinstance(v, tuple) else v


def _probe_dtype(p: torch.Tensor) -> torch.dtype:
    """A float type holding every flat index of ``p`` exactly (probes stay parameters, which
    must be floating point)."""
    return torch.float32 if p.numel() <= 1 << 24 else torch.float64


def _survivor_masks(t: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """Per dim of a probe of ``shape`` (each element its flat index), which slices are in
    ``t`` (the probe after a resize kept some of them)."""
    strides = torch.ones(len(shape), dtype=torch.long)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    masks = []
    for d, size in enumerate(shape):
        mask = torch.zeros(size, dtype=torch.bool)
        if t.numel():
            line = t.detach()
            for other in range(len(shape) - 1, -1, -1):  # views: nothing copied
                if other != d:
                    line = line.select(other, 0)
            mask.index_fill_(0, (line.long() // strides[d]) % size, True)
        masks.append(mask)
    return masks


# -- the reference: trial resizes of whole-model probe copies -------------------------------
def probe_layout(model: nn.Module, symmap: SymMap) -> Layout:
    """The layout learned without the analysis' segments: resizes of throw-away copies of the
    model whose parameters are probes, with subsets of units chosen so that the slices
    surviving each resize spell, bit by bit, the unit each slice belongs to
    (``⌈log2(units + 1)⌉`` resizes of a copy per batch of groups that change no parameter in
    common; ``2·⌈log2 groups⌉`` more where the blocks of one ``chunk`` share a parameter).

    The reference :func:`layout` is checked against (``O(copies of the model)`` in time and
    memory: for tests and small models)."""
    _check(model, symmap)
    params = dict(model.named_parameters())
    shapes = {name: tuple(p.shape) for name, p in params.items()}
    groups = symmap.groups()
    sizes = {g.name: g.size for g in groups}
    live = [g for g in groups if g.size >= 2]
    slices: dict[str, list[Slices]] = {g.name: [] for g in live}
    if not live:
        return Layout(shapes, slices, sizes)
    probes = {name: nn.Parameter(torch.arange(p.numel(), dtype=_probe_dtype(p)).reshape(p.shape),
                                 requires_grad=False) for name, p in params.items()}
    touches = _touches(model, live)
    for batch in _batches(live, touches):
        _probe_batch(model, symmap, params, probes, batch, touches, slices)
    return Layout(shapes, slices, sizes)


def _touches(model: nn.Module, live: Sequence[SymGroup]) -> dict[str, set[str]]:
    """Per group, the parameters its resize may change: those of its member modules and their
    submodules, and its parameter members (under each parameter's first name)."""
    first = {id(p): n for n, p in model.named_parameters()}
    modules = dict(model.named_modules())
    out: dict[str, set[str]] = {}
    for g in live:
        names: set[str] = set()
        for qualname, sname in g.members:
            mod = modules.get(qualname)
            if mod is None:
                continue
            pname, colon, dim = sname.rpartition(":")
            if colon and dim.isdigit():
                p = getattr(mod, pname, None)
                if isinstance(p, torch.Tensor) and id(p) in first:
                    names.add(first[id(p)])
            elif not colon:
                names.update(first[id(p)] for p in mod.parameters() if id(p) in first)
        out[g.name] = names
    return out


def _batches(live: Sequence[SymGroup], touches: Mapping[str, set[str]]
             ) -> list[list[SymGroup]]:
    """The groups in batches that resize no parameter twice (a head, its queries and its
    dims all cut the rows of one projection: they go in different batches), except groups
    tied by ``same_size``, which must go together (they cut disjoint segments)."""
    by_name = {g.name: g for g in live}
    units: list[list[SymGroup]] = []
    placed: set[str] = set()
    for g in live:
        if g.name in placed:
            continue
        tied = [g] + [by_name[n] for n in getattr(g, "same_size", ()) if n in by_name]
        placed.update(t.name for t in tied)
        units.append(tied)
    batches: list[tuple[list[SymGroup], set[str]]] = []
    for unit in units:
        need = set().union(*(touches[t.name] for t in unit))
        for members, used in batches:
            if not used & need:
                members.extend(unit)
                used |= need
                break
        else:
            batches.append((list(unit), set(need)))
    return [members for members, _ in batches]


def _probe_batch(model: nn.Module, symmap: SymMap, params: Mapping[str, nn.Parameter],
                 probes: Mapping[str, nn.Parameter], live: Sequence[SymGroup],
                 touches: Mapping[str, set[str]], slices: dict[str, list[Slices]]) -> None:
    """Find the slices of the groups ``live`` (no parameter resized by two of them but for
    ``same_size`` blocks) and append them to ``slices``."""
    owners: dict[str, list[int]] = {}
    for i, g in enumerate(live):
        for name in touches[g.name]:
            owners.setdefault(name, []).append(i)
    # unit u is coded u + 1 and a slice of it dropped by call k when bit k of its code is set:
    # a slice no call drops belongs to no unit (groups too small for bit k keep everything)
    unit_bits = max(g.size for g in live).bit_length()
    kept_unit = [_survivors(model, symmap, params, probes, {
        g.name: [u for u in range(g.size) if not ((u + 1) >> k) & 1]
        for g in live if g.size >= 1 << k}) for k in range(unit_bits)]
    # the blocks of one chunk cut one parameter: which block a slice is in, bit by bit
    shared = any(len(ids) > 1 for ids in owners.values())
    group_bits = (len(live) - 1).bit_length() if shared else 0
    kept_group: list[tuple[dict[str, list[torch.Tensor]], dict[str, list[torch.Tensor]]]] = []
    for j in range(group_bits):
        first = _survivors(model, symmap, params, probes, {
            g.name: _code_subset(g.size, bool((i >> j) & 1)) for i, g in enumerate(live)})
        second = _survivors(model, symmap, params, probes, {
            g.name: [g.size - 1] if (i >> j) & 1 else [0] for i, g in enumerate(live)})
        kept_group.append((first, second))
    for name in params:
        ids = owners.get(name, [])
        for dim, size in enumerate(params[name].shape):
            code = torch.zeros(size, dtype=torch.long)
            dropped = torch.zeros(size, dtype=torch.bool)
            for k, kept in enumerate(kept_unit):
                code |= (~kept[name][dim]).long() << k
                dropped |= ~kept[name][dim]
            where = dropped.nonzero().flatten()
            if where.numel() == 0:
                continue
            if not ids:
                raise PlanError(f"a resize changed {name}, which belongs to no member of the "
                                "groups resized: a resize rule reaches outside its module")
            unit = code - 1
            gid = torch.full((size,), ids[0], dtype=torch.long)
            if len(ids) > 1:
                gid.zero_()
                for j, (first, second) in enumerate(kept_group):
                    k1, k2 = first[name][dim], second[name][dim]
                    odd = unit % 2 == 1
                    bit = torch.where(odd, ~k1, torch.where(unit == 0, k1, k1 | k2))
                    gid |= bit.long() << j
            for i in sorted(set(gid[where].tolist())):
                at = where[gid[where] == i]
                if i not in ids or not 0 <= int(unit[at].min()) <= int(unit[at].max()) < live[
                        i].size:
                    raise PlanError(f"cannot tell which units {name} (dim {dim}) belongs to: "
                                    "a resize rule does more than keep slices")
                slices[live[i].name].append(Slices(name, dim, at, unit[at]))


def _code_subset(size: int, bit: bool) -> list[int]:
    """Units kept in the first call of a group-code bit: the even units (bit set) or the odd
    ones, as many either way (see :func:`probe_layout`)."""
    evens = [u for u in range(0, size, 2) if not (size % 2 and u == size - 1)]
    return evens if bit else list(range(1, size, 2))


def _survivors(model: nn.Module, symmap: SymMap, params: Mapping[str, nn.Parameter],
               probes: Mapping[str, nn.Parameter], choices: Mapping[str, list[int]]
               ) -> dict[str, list[torch.Tensor]]:
    """Resize a probe copy of ``model`` with ``choices``; for every parameter and dim, which
    slices survived (a bool mask over the original slices)."""
    memo: dict[int, Any] = computed_tensors(model, meta=True)
    memo.update((id(p), probes[name]) for name, p in params.items())
    for _, b in model.named_buffers():
        memo[id(b)] = torch.empty(b.shape, dtype=b.dtype, device="meta")
    memo[id(symmap.graph_module)] = None
    memo[id(symmap.trace_report)] = symmap.trace_report
    clone_model, clone_map = copy.deepcopy((model, symmap), memo)
    try:
        with warnings.catch_warnings():  # about a throw-away copy: the real resize says it
            warnings.simplefilter("ignore")
            resize(clone_model, clone_map, choices)
    except Exception as exc:
        raise PlanError(f"cannot map the units of the groups onto the parameters: a trial "
                        f"resize of a copy failed: {exc}") from exc
    after = dict(clone_model.named_parameters())
    out: dict[str, list[torch.Tensor]] = {}
    for name, shape in ((n, tuple(p.shape)) for n, p in params.items()):
        t = after.get(name)
        if t is None or t.dim() != len(shape) or t.dtype != probes[name].dtype:
            raise PlanError(f"cannot tell where the units of the groups lie in {name}: a resize "
                            "rule replaced it instead of keeping slices of it")
        out[name] = _survivor_masks(t, shape)
    return out
