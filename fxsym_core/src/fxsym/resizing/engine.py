"""``fxsym.resize``: keep chosen entries of groups in every member module.

The engine is transactional. It validates every choice and finds a resize rule for every
module it will touch *before* touching anything; then it snapshots every module of the model
(rules edit child modules and attributes too), empties the caches the trace found in the
modules it changes and their owners, applies the rules — after each, it sets the
attributes its module's SymInfo declares from the symbol just resized (:mod:`.declared`,
checked with the choices) — and if anything raises, even a KeyboardInterrupt, it puts every
module back as it was and re-raises (an ``Exception`` as :class:`~fxsym.errors.ResizeError`).
Rules must bind new tensors, never write into old ones.
A cache (:attr:`SymMap.derived_state`: a container the traced forward fills again from
empty, such as timm's ``attention_bias_cache``) left filled would keep values computed from
the old weights; the emptying is part of the transaction. Derived tensors no trace showed to
be a cache make the resize refuse with :class:`~fxsym.errors.StaleStateError`, before
anything is touched, unless the analysis proved them computed from nothing a resize changes
(``modstate.INVARIANT``, :mod:`fxsym.analysis.derived`: ultralytics' anchors, a grid of cell
centres), which stay as they are.
Once the rules ran, the plugins' ``fxsym_after_resize`` hooks bring what else describes the
model up to date (a Hugging Face ``config``), inside the transaction: a failing hook restores
the model too. A SymMap describes the model as analyzed: after a resize it is stale and must be
recomputed with :func:`fxsym.analyze`.
"""

from __future__ import annotations

import copy
import difflib
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import nn

from ..errors import ResizeError, ResizeWarning, StaleStateError
from ..modstate import CACHE, DERIVED, ModuleTreeState
from ..plugins.calls import call_each
from ..registry import Registry, SymInfoEntry
from ..symbols import (
    ATTRIBUTE_PREFIX,
    GroupAnalysis,
    GroupIndex,
    Segment,
    SymGroup,
    SymMap,
    set_attribute,
)
from .block_dropping import depth_choices, drop_blocks
from .declared import plan_declared
from .helpers import keep_entries, l1_scores

Choice = Any  # int | Sequence[int] | torch.Tensor


def resize(model: nn.Module, symmap: SymMap, choices: Mapping[str, Choice]) -> nn.Module:
    """Shrink (or reorder) groups of ``model`` in place and return it.

    ``choices`` maps a group name to the indices to keep, in that order (a list or a 1-D
    integer tensor), or to an int: keep that many entries, the ones with the largest L1 norm
    of their producers' weights, in their original order. A depth group's name
    (:meth:`SymMap.depth_groups`) maps to the blocks to keep, increasing
    (:mod:`fxsym.resizing.block_dropping`); they are dropped after the other groups are resized.
    """
    if symmap.model is not model:
        raise ResizeError("this SymMap was computed for another model; call fxsym.analyze(model)")
    if symmap.is_stale:
        raise ResizeError("the model was resized since this SymMap was computed; analyze again")
    if not isinstance(choices, Mapping):
        raise ResizeError(f"choices must be a mapping of group name to indices, got {choices!r}")
    depth = depth_choices(symmap, choices)
    if depth:
        return _resize_with_depth(model, symmap, choices, depth)
    groups = {g.name: g for g in symmap.groups()}
    plans: dict[int, torch.Tensor] = {}
    for name, choice in choices.items():
        group = groups.get(name)
        if group is None:
            raise ResizeError(_not_a_group(symmap, str(name), groups))
        plans[group.id] = _indices(symmap, group, choice)
        if len(plans[group.id]) < group.min_size:
            raise ResizeError(f"{name}: an op picks {group.min_size} of its entries by "
                              f"value (topk), so a resize must keep at least {group.min_size} "
                              f"(got {len(plans[group.id])})")
        kept = len(plans[group.id])
        if kept % group.step and kept != group.size:
            warnings.warn(f"{name}: keeping {kept} units, not a multiple of {group.step}: "
                          f"{group.step_reason}", ResizeWarning, stacklevel=2)
    for name in choices:  # blocks cut by ``chunk`` keep equal sizes
        group = groups[name]
        for other in group.same_size:
            kept = len(plans[groups[other].id]) if groups[other].id in plans else group.size
            if kept != len(plans[group.id]):
                raise ResizeError(f"{name} and {other} must keep as many units as each other "
                                  f"(blocks of one chunk): got {len(plans[group.id])} and {kept}")

    analysis = symmap.analysis
    work = [] if analysis is None else _work(model, symmap.registry, analysis, plans)
    declared = plan_declared(symmap, {(q, s): len(index) for _, q, s, index, _ in work})
    fields = _object_fields(work)
    caches = _stale_caches(model, symmap, work)
    work = [step for step in work if not _is_object_field(step)]
    ties = _tied_parameters(model)
    saved = _snapshot(model)
    where = ""
    try:
        where = "caches"
        for _, cache in caches:
            cache.clear()
        for mod, qualname, sname, index, entry in work:
            where = f"{qualname}.{sname}"
            assert entry.resize is not None
            entry.resize(mod, sname, index)
            if qualname in declared:
                declared[qualname].follow(sname, len(index))
        where = "config fields"
        _set_object_fields(model, fields)
        where = "tied parameters"
        _retie(ties)
        where = "the model (fxsym_after_resize)"
        _after_resize(model, symmap, plans, work)
    except BaseException as exc:
        _restore(saved)
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: restored, as is
            raise
        written = _written_in_place(saved)
        if written:
            raise ResizeError(
                f"resizing {where} failed: {exc}; model restored except the tensors a resize "
                f"rule wrote in place: {', '.join(written)} (rules must replace parameters "
                "and buffers, never write into them)") from exc
        raise ResizeError(f"resizing {where} failed, model restored: {exc}") from exc
    symmap.mark_stale()
    return model


def _resize_with_depth(model: nn.Module, symmap: SymMap, choices: Mapping[str, Choice],
                       depth: dict[str, list[int]]) -> nn.Module:
    """Resize the groups of ``choices``, then drop the blocks ``depth`` says (the width
    groups' members are named as analyzed, before blocks move), all in one transaction."""
    width = {k: v for k, v in choices.items() if k not in depth}
    saved = _snapshot(model)
    try:
        if width:
            resize(model, symmap, width)
        drop_blocks(model, symmap, depth)
    except BaseException as exc:
        _restore(saved)
        if isinstance(exc, ResizeError) or not isinstance(exc, Exception):
            raise
        raise ResizeError(f"dropping blocks failed, model restored: {exc}") from exc
    symmap.mark_stale()
    return model


def _not_a_group(symmap: SymMap, name: str, groups: Mapping[str, SymGroup]) -> str:
    """Why ``name`` cannot be resized: a size of the model that is constant (and why), one
    that belongs to another group, or no size at all (with the nearest group names)."""
    qualname, _, symbol = name.rpartition(".")
    analysis = symmap.analysis
    dim = None if analysis is None else analysis.symbol_dims.get((qualname, symbol))
    if analysis is not None and dim is not None:
        roots = {analysis.table.find(s.group) for s in dim if s.group is not None}
        owners = [g.name for g in groups.values() if g.id in roots]
        if owners:
            return (f"{name!r} is a member of group {owners[0]!r}, not a group of its own: "
                    f"resize {owners[0]!r}")
        why = symmap.why_constant(qualname, symbol)
        return f"{name!r} is constant: {why} (see symmap.trace_report)"
    near = difflib.get_close_matches(name, list(groups), n=3)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    return f"unknown group {name!r}{hint} ({len(groups)} groups known)"


#: one resize rule call: the module, its qualified name, the symbol (or parameter member), the
#: entries to keep and the registry entry holding the rule
_Step = tuple[nn.Module, str, str, torch.Tensor, SymInfoEntry]


def _work(model: nn.Module, registry: Registry, analysis: GroupAnalysis,
          plans: dict[int, torch.Tensor]) -> list[_Step]:
    """Every resize rule call ``plans`` (entries to keep, by group root) needs, in the order of
    ``analysis.symbol_dims``; raises ResizeError before anything is touched."""
    modules = dict(model.named_modules())
    table = analysis.table
    work: list[_Step] = []
    for (qualname, sname), dim in analysis.symbol_dims.items():
        roots = {table.find(s.group) for s in dim if s.group is not None}
        if not roots & plans.keys():
            continue
        mod = modules.get(qualname)
        if mod is None:
            raise ResizeError(f"module {qualname!r} is no longer part of the model")
        if (qualname, sname) in analysis.param_members:
            work.append((mod, qualname, sname, dim_index(table, dim, plans), _PARAMETER))
            continue
        entry = registry.sym_info_entry(type(mod))
        if entry is None or entry.resize is None:
            raise ResizeError(
                f"no resize rule for {type(mod).__name__} ({qualname}.{sname}); register one "
                "with the fxsym_register_sym_infos hook (resize=...)"
            )
        work.append((mod, qualname, sname, dim_index(table, dim, plans), entry))
    return work


def _stale_caches(model: nn.Module, symmap: SymMap, work: list[_Step]
                  ) -> list[tuple[str, Any]]:
    """The caches to empty (``(qualname.attribute, container)``) so that no module the resize
    changes, nor any module holding one (its owners), keeps state derived from the model as it
    was (:attr:`SymMap.derived_state`). Raises :class:`StaleStateError`, before anything is
    touched, if such a module holds derived tensors the trace did not show to be a cache."""
    derived = symmap.derived_state
    if not derived or not work:
        return []
    changed: set[str] = set()
    for _, qualname, _, _, _ in work:
        parts = qualname.split(".") if qualname else []
        changed.update(".".join(parts[:i]) for i in range(len(parts) + 1))
    modules = dict(model.named_modules())
    caches: list[tuple[str, Any]] = []
    for qualname in sorted(changed & derived.keys()):
        mod = modules.get(qualname)
        if mod is None:
            continue
        for attr, kind in derived[qualname].items():
            value = vars(mod).get(attr)
            where = f"{qualname}.{attr}" if qualname else attr
            if kind == CACHE and isinstance(value, (dict, list, set)):
                if value:
                    caches.append((where, value))
            elif kind == DERIVED and _holds_tensor(value):
                raise StaleStateError(
                    f"{where} holds tensors the model derived (the forward reads them) from "
                    "what a resize changes, and the trace did not show them to be recomputed "
                    "when missing; a resize would leave them stale. Clear it, or make them "
                    "buffers, and resize again")
    return caches


def _holds_tensor(value: Any, depth: int = 0) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if depth < 3 and isinstance(value, (list, tuple, set)):
        return any(_holds_tensor(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict) and not isinstance(value, nn.Module):
        return any(_holds_tensor(v, depth + 1) for v in value.values())
    return False


def _after_resize(model: nn.Module, symmap: SymMap, plans: dict[int, torch.Tensor],
                  work: list[_Step]) -> None:
    """Call every plugin's ``fxsym_after_resize``; raise if one failed (it was disabled) or
    if the caller's filters make a warning it issued an error."""
    pm = symmap.registry.plugin_manager
    kept = {g.name: plans[g.id] for g in symmap.groups() if g.id in plans}
    sizes: dict[tuple[str, str], tuple[int, int]] = {}
    dims = symmap.analysis.symbol_dims if symmap.analysis is not None else {}
    for _, qualname, sname, index, _ in work:
        before = sum(seg.units * seg.block for seg in dims[(qualname, sname)])
        if before != len(index):
            sizes[(qualname, sname)] = (before, len(index))
    failed = len(pm.failed)
    args = {"model": model, "symmap": symmap, "kept": kept, "sizes": sizes}
    with warnings.catch_warnings(record=True) as issued:
        warnings.simplefilter("always")
        for _ in call_each(pm, "fxsym_after_resize", lambda _: args):
            pass
    # the hooks' warnings are issued here, under the caller's filters: one turned into an
    # error fails the resize (rolled back) without blaming the plugin
    for w in issued:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    if len(pm.failed) > failed:
        failure = pm.failed[failed]
        raise ResizeError(f"plugin {failure.name!r} failed: {failure.error}")


def _tied_parameters(model: nn.Module) -> list[tuple[nn.Parameter, list[tuple[nn.Module, str]]]]:
    """Each Parameter object held at several places (a tied ``lm_head`` and embedding), with
    those places."""
    places: dict[int, tuple[nn.Parameter, list[tuple[nn.Module, str]]]] = {}
    for mod in model.modules():
        for pname, p in mod.named_parameters(recurse=False, remove_duplicate=False):
            places.setdefault(id(p), (p, []))[1].append((mod, pname))
    return [v for v in places.values() if len(v[1]) > 1]


def _retie(ties: list[tuple[nn.Parameter, list[tuple[nn.Module, str]]]]) -> None:
    """Make tied places share one Parameter again.

    The analysis ties every dim of a shared tensor across all of its places in the graph, so
    the places a resize changed hold equal tensors; places it did not reach (a module outside
    the graph, such as T5's ``shared`` embedding) take the resized tensor too. Places changed
    differently would mean a tie the analysis missed: that raises, and the model is restored.
    """
    for original, places in ties:
        current = [getattr(mod, pname) for mod, pname in places]
        changed = [p for p in current if p is not original]
        if not changed:
            continue
        new = changed[0]
        for p in changed[1:]:
            if p is not new and (p.shape != new.shape or not (
                    p.is_meta or new.is_meta or torch.equal(p, new))):  # meta: shapes only
                where = ", ".join(f"{type(m).__name__}.{n}" for m, n in places)
                raise ResizeError(f"a parameter shared by {where} was resized differently at "
                                  "its places; analyze the model again")
        for mod, pname in places:
            if getattr(mod, pname) is not new:
                setattr(mod, pname, new)


def _is_object_field(step: _Step) -> bool:
    """A member ``(owner, "attr:config.hidden_size")``: a field of an object the owner holds."""
    _, _, sname, _, entry = step
    return entry is _PARAMETER and sname.startswith(ATTRIBUTE_PREFIX) and "." in sname


def _object_fields(work: list[_Step]) -> dict[int, tuple[Any, dict[str, int]]]:
    """The int fields of objects held by modules (a ``config``) that ``work`` sets: by the
    object's id, the object and each field's new value. Several modules sharing one config
    share its fields' groups; raises ResizeError if they would set one field to two values."""
    out: dict[int, tuple[Any, dict[str, int]]] = {}
    for step in filter(_is_object_field, work):
        mod, qualname, sname, index, _ = step
        attr, _, field = sname.removeprefix(ATTRIBUTE_PREFIX).partition(".")
        obj = getattr(mod, attr, None)
        if obj is None or not isinstance(vars(obj).get(field), int):
            raise ResizeError(f"{qualname}.{attr}.{field} is no longer an int field")
        values = out.setdefault(id(obj), (obj, {}))[1]
        if values.setdefault(field, len(index)) != len(index):
            raise ResizeError(f"{qualname}.{attr}.{field} is shared by modules that would set "
                              f"it to {values[field]} and {len(index)}; analyze again")
    return out


def _set_object_fields(model: nn.Module, fields: dict[int, tuple[Any, dict[str, int]]]
                       ) -> None:
    """Give every module holding one of the objects a shallow copy with the new field values
    (the object itself is never changed, so the transaction's restore puts it back)."""
    copies: dict[int, Any] = {}
    for key, (obj, values) in fields.items():
        new = copy.copy(obj)
        for field, value in values.items():
            setattr(new, field, value)
        copies[key] = new
    for mod in model.modules():
        state = vars(mod)
        for name, value in list(state.items()):
            if id(value) in copies and value is fields[id(value)][0]:
                state[name] = copies[id(value)]


def _keep_parameter_entries(mod: nn.Module, member: str, index: torch.Tensor) -> None:
    """A member that is not a symbol: a tensor ``"name:dim"`` keeps ``index`` along ``dim``;
    an int attribute ``"attr:name"`` read as a size (or an element, ``"attr:name[i]"``)
    becomes the number of entries kept."""
    pname, _, dim = member.rpartition(":")
    if not dim.isdigit():  # "attr:width"
        set_attribute(mod, dim, len(index))
        return
    keep_entries(mod, pname, int(dim), index)


_PARAMETER = SymInfoEntry(nn.Module, lambda m: None, resize=_keep_parameter_entries)


def _indices(symmap: SymMap, group: SymGroup, choice: Choice) -> torch.Tensor:
    name, size = group.name, group.size
    if isinstance(choice, bool):
        raise ResizeError(f"{name}: expected a size or indices, got {choice!r}")
    if isinstance(choice, int):
        if not 1 <= choice <= size:
            raise ResizeError(f"{name}: size must be between 1 and {size}, got {choice}")
        scores = _importance(symmap, group)
        if scores is None:
            return torch.arange(choice)
        return torch.topk(scores, choice, sorted=False).indices.sort().values
    try:
        index = torch.as_tensor(choice)
    except Exception as exc:
        raise ResizeError(f"{name}: indices must be integers, got {choice!r}") from exc
    if index.device.type == "meta":
        raise ResizeError(f"{name}: the indices are a tensor on the meta device, which holds no "
                          "values; pass them as a list or a tensor on a real device")
    try:  # indices on another device (cuda, ...) are moved: the engine works on the CPU
        index = index.detach().to("cpu")
    except Exception as exc:
        raise ResizeError(f"{name}: cannot read the indices on {index.device}: {exc}") from exc
    if index.numel() == 0:
        raise ResizeError(f"{name}: cannot keep 0 entries")
    if index.dim() != 1 or index.is_floating_point() or index.dtype == torch.bool:
        raise ResizeError(f"{name}: indices must be a 1-D list of integers, got {choice!r}")
    index = index.long()
    if int(index.min()) < 0 or int(index.max()) >= size:
        raise ResizeError(f"{name}: indices must lie in [0, {size}), got {index.tolist()}")
    if index.unique().numel() != index.numel():  # type: ignore[no-untyped-call]
        raise ResizeError(f"{name}: duplicate indices {index.tolist()}")
    if not group.is_sortable and bool((index[1:] <= index[:-1]).any()):
        raise ResizeError(f"{name} is not sortable: indices must be increasing")
    return index


def _importance(symmap: SymMap, group: SymGroup) -> torch.Tensor | None:
    registry = symmap.registry
    modules = dict(symmap.model.named_modules())
    total: torch.Tensor | None = None
    analysis = symmap.analysis
    producers = analysis.producers if analysis else {}
    for qualname, sname in producers.get(group.id, ()):
        mod = modules.get(qualname)
        entry = registry.sym_info_entry(type(mod)) if mod is not None else None
        member = analysis is not None and (qualname, sname) in analysis.param_members
        if mod is None or (not member and (entry is None or entry.importance is None)):
            continue
        try:
            if member:  # a functional op's parameter: the L1 norm of its slices along the dim
                pname, _, d = sname.rpartition(":")
                score = l1_scores(getattr(mod, pname), int(d))
            else:
                assert entry is not None and entry.importance is not None
                score = torch.as_tensor(entry.importance(mod, sname))
            score = score.detach().float().flatten()
        except Exception as exc:
            raise ResizeError(f"{group.name}: scoring {qualname}.{sname} failed: {exc}; pass "
                              "indices instead of a size") from exc
        if score.device.type == "meta":
            raise ResizeError(f"{group.name}: the weights of {qualname} are on the meta device "
                              "and hold no values to rank entries by; pass indices instead "
                              "of a size")
        dim = analysis.symbol_dims.get((qualname, sname), ()) if analysis else ()
        if len(dim) > 1 and score.numel() == sum(seg.units * seg.block for seg in dim):
            score = _unit_sums(dim, score.cpu(), group.size)
        elif score.numel() % group.size == 0:
            score = score.reshape(group.size, -1).sum(1).cpu()
        else:
            continue
        total = score if total is None else total + score
    return total


def _unit_sums(dim: Sequence[Segment], scores: torch.Tensor, units: int) -> torch.Tensor:
    """Per unit of the one group a dim laid out as ``dim`` holds in several copies (a group
    norm that keeps its norm groups), the sum of the scores of its entries in every copy."""
    total = torch.zeros(units, dtype=scores.dtype)
    offset = 0
    for seg in dim:
        length = seg.units * seg.block
        total += scores[offset:offset + length].reshape(units, -1).sum(1)
        offset += length
    return total


def dim_index(table: GroupIndex, dim: Sequence[Segment], plans: dict[int, torch.Tensor]
              ) -> torch.Tensor:
    """The entries of a dimension laid out as ``dim`` to keep, once each group in ``plans``
    (by root) keeps the units given there."""
    parts: list[torch.Tensor] = []
    offset = 0
    for seg in dim:
        length = seg.units * seg.block
        root = table.find(seg.group) if seg.group is not None else None
        plan = plans.get(root) if root is not None else None
        if root is None or plan is None:
            parts.append(torch.arange(offset, offset + length))
        else:  # group units -> this segment's (finer) units -> entries
            per_unit = seg.units // table.units[root]
            fine = (plan[:, None] * per_unit + torch.arange(per_unit)[None, :]).flatten()
            block = torch.arange(seg.block)
            parts.append((fine[:, None] * seg.block + block[None, :]).flatten() + offset)
        offset += length
    return torch.cat(parts)


# -- the transaction -------------------------------------------------------------------------
# A rule may rebind anything a module holds: its parameters and buffers, attributes such as
# a count read as a size, child modules, entries of its dicts. It must not write into a tensor (the
# engine keeps references, not copies: a copy of every weight would double the memory).
# So the snapshot is the module tree's state (:class:`~fxsym.modstate.ModuleTreeState`, no
# tensor copied) plus a fingerprint of each parameter and buffer, which detects a write in
# place.


class _Snapshot(NamedTuple):
    modules: ModuleTreeState
    tensors: list[tuple[str, torch.Tensor, tuple[Any, ...] | None]]


def _snapshot(model: nn.Module) -> _Snapshot:
    """The state of every module of ``model``, enough to undo any rebinding."""
    tensors: list[tuple[str, torch.Tensor, tuple[Any, ...] | None]] = []
    seen: set[int] = set()
    for prefix, mod in model.named_modules():
        for name, t in (*mod.named_parameters(recurse=False, remove_duplicate=False),
                        *mod.named_buffers(recurse=False, remove_duplicate=False)):
            if id(t) not in seen:
                seen.add(id(t))
                tensors.append((f"{prefix}.{name}" if prefix else name, t, _fingerprint(t)))
    return _Snapshot(ModuleTreeState(model), tensors)


def _fingerprint(t: torch.Tensor) -> tuple[Any, ...] | None:
    try:
        return t._version, t.data_ptr(), t.shape, t.dtype, t.device
    except Exception:  # inference tensors have no version counter, some subclasses no storage
        return None


def _restore(saved: _Snapshot) -> None:
    """Put back every module's state; an interrupt landing in the middle just runs the
    (idempotent) restore again."""
    for attempt in range(3):
        try:
            saved.modules.restore()
            return
        except BaseException:
            if attempt == 2:
                raise


def _written_in_place(saved: _Snapshot) -> list[str]:
    """Names of the snapshot's tensors whose contents changed since (the restore cannot undo
    that: the engine keeps no copy of the data)."""
    return [name for name, t, fp in saved.tensors if fp is not None and _fingerprint(t) != fp]
