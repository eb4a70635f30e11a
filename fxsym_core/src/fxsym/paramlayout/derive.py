"""The direct derivation of the :class:`~fxsym.paramlayout.slices.ParamLayout` from the analysis:
:func:`layout`, in the size of the metadata.

A parameter member's units are read off its segments; a symbol's by trial runs of its
family's resize rule on a meta copy of its one module, under
:func:`~fxsym.resizing.observe_keeps`, with subsets of units that spell, bit by bit, the unit
of each slice (``_Deriver._decode``), else on a copy holding probes (:mod:`.probes`).
Modules whose rules and state are alike (:mod:`.signature`) are run once. See the package's
docstring for the whole design.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import PlanError
from ..modstate import ModuleTreeState, computed_tensors
from ..resizing import dim_index, observe_keeps
from ..symbols import GroupIndex, Segment, SymGroup, SymMap
from .copying import _clone_of
from .probes import probe_dtype, survivor_masks
from .signature import _signature, _Slot
from .slices import ParamLayout, Slices

_LAYOUTS: weakref.WeakKeyDictionary[SymMap, ParamLayout] = weakref.WeakKeyDictionary()


def layout(model: nn.Module, symmap: SymMap) -> ParamLayout:
    """The :class:`ParamLayout` of ``model`` as analyzed in ``symmap`` (computed once per SymMap).

    Raises :class:`~fxsym.errors.PlanError` when a resize rule does something other than
    keeping slices of parameters (nothing would say where the units are).
    """
    check_current(model, symmap)
    cached = _LAYOUTS.get(symmap)
    if cached is None:
        with warnings.catch_warnings():  # of trial resizes of copies: the real resize says it
            warnings.simplefilter("ignore")
            cached = _LAYOUTS[symmap] = _Deriver(model, symmap).layout()
    return cached


def check_current(model: nn.Module, symmap: SymMap) -> None:
    """:class:`~fxsym.errors.PlanError` unless ``symmap`` was computed for ``model`` and the
    model was not resized since."""
    if symmap.model is not model:
        raise PlanError("this SymMap was computed for another model; call fxsym.analyze(model)")
    if symmap.is_stale:
        raise PlanError("the model was resized since this SymMap was computed; analyze again")


# -- the direct derivation ------------------------------------------------------------------
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

    def layout(self) -> ParamLayout:
        symmap, analysis = self.symmap, self.symmap.analysis
        shapes = {name: tuple(p.shape) for name, p in self.params.items()}
        groups = symmap.groups()
        sizes = {g.name: g.size for g in groups}
        live = {g.id: g for g in groups if g.size >= 2}
        if not live:
            return ParamLayout(shapes, {}, sizes)
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
        return ParamLayout(shapes, slices, sizes)

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
            probe = nn.Parameter(torch.arange(p.numel(), dtype=probe_dtype(p)).reshape(
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
                masks = survivor_masks(t, tuple(p.shape))
                out.update(((_join(sub, pname), d), m) for d, m in enumerate(masks)
                           if not bool(m.all()))
        return out


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
