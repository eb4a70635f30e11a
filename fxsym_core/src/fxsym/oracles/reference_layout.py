"""The layout oracle: :func:`probe_layout`, the parameter layout learned by trial resizes of
whole-model probe copies, with no knowledge of the analysis' segments (``O(copies of the
model)``: for tests and small models).

It is the reference :func:`fxsym.paramlayout.layout` is checked against (the tests compare
the two on torchvision, Hugging Face and fuzzed models): an oracle of the derived layout as
the other oracles are of the analysis, so it lives with them, in the wheel, where a plugin
author checking a new resize rule can call it (it was ``fxsym.paramlayout.probe_layout``,
which still works, with a ``DeprecationWarning``).
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from ..errors import PlanError
from ..modstate import computed_tensors
from ..paramlayout import ParamLayout, Slices
from ..paramlayout.derive import check_current
from ..paramlayout.probes import probe_dtype, survivor_masks
from ..resizing import resize
from ..symbols import SymGroup, SymMap


def probe_layout(model: nn.Module, symmap: SymMap) -> ParamLayout:
    """The layout learned without the analysis' segments: resizes of throw-away copies of the
    model whose parameters are probes, with subsets of units chosen so that the slices
    surviving each resize spell, bit by bit, the unit each slice belongs to
    (``⌈log2(units + 1)⌉`` resizes of a copy per batch of groups that change no parameter in
    common; ``2·⌈log2 groups⌉`` more where the blocks of one ``chunk`` share a parameter).

    The reference :func:`fxsym.paramlayout.layout` is checked against (``O(copies of the
    model)`` in time and memory: for tests and small models)."""
    check_current(model, symmap)
    params = dict(model.named_parameters())
    shapes = {name: tuple(p.shape) for name, p in params.items()}
    groups = symmap.groups()
    sizes = {g.name: g.size for g in groups}
    live = [g for g in groups if g.size >= 2]
    slices: dict[str, list[Slices]] = {g.name: [] for g in live}
    if not live:
        return ParamLayout(shapes, slices, sizes)
    probes = {name: nn.Parameter(torch.arange(p.numel(), dtype=probe_dtype(p)).reshape(p.shape),
                                 requires_grad=False) for name, p in params.items()}
    touches = _touches(model, live)
    for batch in _batches(live, touches):
        _probe_batch(model, symmap, params, probes, batch, touches, slices)
    return ParamLayout(shapes, slices, sizes)


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
        out[name] = survivor_masks(t, shape)
    return out
