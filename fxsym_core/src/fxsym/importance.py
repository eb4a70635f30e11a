"""Importance: how much each unit of each group matters, scored over every member.

A unit of a group (a channel, an attention head) lives in many tensors: the rows its producers
write, the columns its consumers read, the scales of the norms between them, parameters used
directly in the graph. Every criterion here scores a unit over *all* of them.

**Which slices belong to which unit** is learned from the resize rules themselves, since the
core knows no module family. :func:`layout` resizes throw-away copies of the model whose
parameters are *probes* (each element holds its own flat index, no weight is copied) with
subsets of units chosen so that the slices surviving each resize spell, bit by bit, the unit
each slice belongs to: ``⌈log2(units + 1)⌉`` resizes of a copy per batch of groups that change
no parameter in common (a few batches: a conv's input and output groups, a head, its queries
and its dims go in different ones). The blocks of one ``chunk`` (``SymGroup.same_size``) must
be cut together; where they share a parameter, ``2·⌈log2 groups⌉`` more resizes spell which
block each slice is in, every subset keeping as many units in groups of equal size. The
result, a :class:`Layout`, also counts the parameters a choice of sizes leaves (used by
:mod:`fxsym.planning`). The warnings of these trial resizes (a plugin's "the config does not
describe the resized model") are about throw-away copies and are not shown: the real resize
issues them once.

**Criteria** are callables ``criterion(model, symmap) -> {group name: scores}`` with one score
per unit (``SymGroup.size`` of them); a group a criterion cannot score is left out:

* :func:`l1`, :func:`l2`: the L1 / L2 norm of all the unit's weights;
* :func:`bn_scale`: the L1 norm of the batch-norm scales (``weight``) of the unit; groups
  without a batch norm are left out;
* :func:`taylor` ``(loss_fn, batches)``: first order Taylor, ``Σ |w · ∂L/∂w|`` over the unit's
  weights, the gradients summed over the batches;
* :func:`activation` ``(batches)``: the mean absolute value of the unit's entries in every
  member's input (consumers) or output (producers) over calibration batches, summed over the
  members; needs no parameter.

Long criteria (batches) show a progress bar with ``rich`` when asked and installed.

Imports from fxsym: errors, resizing, symbols.
"""

from __future__ import annotations

import contextlib
import copy
import math
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .errors import PlanError
from .resizing import resize
from .symbols import Symbol, SymGroup, SymMap

__all__ = [
    "CRITERIA",
    "ActivationRecorder",
    "Criterion",
    "Layout",
    "Slices",
    "activation",
    "bn_scale",
    "criterion_by_name",
    "l1",
    "l2",
    "layout",
    "run_batch",
    "taylor",
]

#: ``criterion(model, symmap) -> {group name: one score per unit}``
Criterion = Callable[[nn.Module, SymMap], dict[str, torch.Tensor]]


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
    slice has an empty list); ``sizes`` the units of every group.
    """

    shapes: Mapping[str, tuple[int, ...]]
    slices: Mapping[str, Sequence[Slices]]
    sizes: Mapping[str, int]

    def shapes_after(self, kept: Mapping[str, int]) -> dict[str, tuple[int, ...]]:
        """Every parameter's shape once each group of ``kept`` keeps that many units.

        A slice stays if every group it belongs to keeps its unit; groups cutting one dim side
        by side (a concatenation) or crosswise (heads x head dims of one projection) are both
        counted exactly, whichever units are kept."""
        shapes = {name: list(shape) for name, shape in self.shapes.items()}
        cut: dict[tuple[str, int], torch.Tensor] = {}
        for group, count in kept.items():
            size = self.sizes[group]
            if count == size:
                continue
            for s in self.slices.get(group, ()):
                share = cut.get((s.param, s.dim))
                if share is None:
                    share = cut[(s.param, s.dim)] = torch.ones(
                        self.shapes[s.param][s.dim], dtype=torch.float64)
                share[s.index] *= count / size
        for (param, dim), share in cut.items():
            shapes[param][dim] = round(float(share.sum()))
        return {name: tuple(shape) for name, shape in shapes.items()}

    def param_count(self, kept: Mapping[str, int]) -> int:
        """How many parameters the model holds once each group of ``kept`` keeps that many
        units (the others unchanged)."""
        return sum(math.prod(s) for s in self.shapes_after(kept).values())


_LAYOUTS: weakref.WeakKeyDictionary[SymMap, Layout] = weakref.WeakKeyDictionary()


def layout(model: nn.Module, symmap: SymMap) -> Layout:
    """The :class:`Layout` of ``model`` as analyzed in ``symmap`` (computed once per SymMap).

    Raises :class:`~fxsym.errors.PlanError` when a resize rule does something other than
    keeping slices of parameters (the probes would not say where the units are).
    """
    if symmap.model is not model:
        raise PlanError("this SymMap was computed for another model; call fxsym.analyze(model)")
    if symmap.is_stale:
        raise PlanError("the model was resized since this SymMap was computed; analyze again")
    cached = _LAYOUTS.get(symmap)
    if cached is None:
        cached = _LAYOUTS[symmap] = _compute_layout(model, symmap)
    return cached


def _compute_layout(model: nn.Module, symmap: SymMap) -> Layout:
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
        _decode(model, symmap, params, probes, batch, touches, slices)
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


def _decode(model: nn.Module, symmap: SymMap, params: Mapping[str, nn.Parameter],
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


def _probe_dtype(p: torch.Tensor) -> torch.dtype:
    """A float type holding every flat index of ``p`` exactly (probes stay parameters, which
    must be floating point)."""
    return torch.float32 if p.numel() <= 1 << 24 else torch.float64


def _code_subset(size: int, bit: bool) -> list[int]:
    """Units kept in the first call of a group-code bit: the even units (bit set) or the odd
    ones, as many either way (see :func:`_compute_layout`)."""
    evens = [u for u in range(0, size, 2) if not (size % 2 and u == size - 1)]
    return evens if bit else list(range(1, size, 2))


def _survivors(model: nn.Module, symmap: SymMap, params: Mapping[str, nn.Parameter],
               probes: Mapping[str, nn.Parameter], choices: Mapping[str, list[int]]
               ) -> dict[str, list[torch.Tensor]]:
    """Resize a probe copy of ``model`` with ``choices``; for every parameter and dim, which
    slices survived (a bool mask over the original slices)."""
    memo: dict[int, Any] = {id(p): probes[name] for name, p in params.items()}
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
                mask[(line.long() // strides[d]) % size] = True
            masks.append(mask)
        out[name] = masks
    return out


# -- scores from the weights ----------------------------------------------------------------
def element_scores(model: nn.Module, symmap: SymMap,
                   score: Callable[[str, torch.Tensor], torch.Tensor | None],
                   finish: Callable[[torch.Tensor], torch.Tensor] = lambda t: t, *,
                   tensors: Callable[[str], torch.Tensor] | None = None,
                   ) -> dict[str, torch.Tensor]:
    """Per group, the sum over its slices of ``score(name, parameter)`` (a tensor shaped like
    the parameter, or ``None``: not scored), per unit, then ``finish`` applied. A group none of
    whose slices was scored is left out; a group of one unit scores ``[1.]``.

    Parameters are visited one at a time and each one's scores dropped before the next, so
    ``tensors(name)`` (default: the model's parameter of that name) may read them from a
    file: scoring a checkpoint holds one parameter at a time (:mod:`fxsym.checkpoint`)."""
    lay = layout(model, symmap)
    if tensors is None:
        params = dict(model.named_parameters())
        tensors = params.__getitem__
    by_param: dict[str, list[tuple[str, Slices]]] = {}
    for g in symmap.groups():
        for s in lay.slices.get(g.name, ()) if g.size >= 2 else ():
            by_param.setdefault(s.param, []).append((g.name, s))
    totals: dict[str, torch.Tensor] = {}
    for name, slices in by_param.items():
        e = score(name, tensors(name))
        if e is None:
            continue
        e = e.detach().to("cpu", torch.float64)
        for gname, s in slices:
            per_slice = e.movedim(s.dim, 0).reshape(e.shape[s.dim], -1).sum(1)
            total = totals.get(gname)
            if total is None:
                total = totals[gname] = torch.zeros(lay.sizes[gname], dtype=torch.float64)
            total.index_add_(0, s.unit, per_slice[s.index])
        del e
    out: dict[str, torch.Tensor] = {}
    for g in symmap.groups():
        if g.size < 2:
            out[g.name] = torch.ones(1, dtype=torch.float64)
        elif g.name in totals:
            out[g.name] = finish(totals[g.name])
    return out


def _meta_check(name: str, p: torch.Tensor) -> None:
    if p.device.type == "meta":
        raise PlanError(f"{name} is on the meta device and holds no values to score")


def l1(model: nn.Module, symmap: SymMap) -> dict[str, torch.Tensor]:
    """The L1 norm of each unit's weights, over every member of its group."""
    def score(name: str, p: torch.Tensor) -> torch.Tensor:
        _meta_check(name, p)
        return p.detach().abs()

    return element_scores(model, symmap, score)


def l2(model: nn.Module, symmap: SymMap) -> dict[str, torch.Tensor]:
    """The L2 norm of each unit's weights, over every member of its group."""
    def score(name: str, p: torch.Tensor) -> torch.Tensor:
        _meta_check(name, p)
        return p.detach().double().square()

    return element_scores(model, symmap, score, torch.sqrt)


_BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


def bn_scale(model: nn.Module, symmap: SymMap) -> dict[str, torch.Tensor]:
    """The L1 norm of the batch-norm scales of each unit; groups without a batch norm are
    left out (a plan leaves them whole)."""
    scales = {f"{q}.weight" if q else "weight" for q, m in model.named_modules()
              if isinstance(m, _BATCH_NORMS) and getattr(m, "weight", None) is not None}

    def score(name: str, p: torch.Tensor) -> torch.Tensor | None:
        if name not in scales:
            return None
        _meta_check(name, p)
        return p.detach().abs()

    return element_scores(model, symmap, score)


# -- scores from data -----------------------------------------------------------------------
def run_batch(model: nn.Module, batch: Any) -> Any:
    """Call ``model`` on one batch: a dict is keyword arguments, a tuple or list positional
    arguments, anything else the one argument."""
    if isinstance(batch, Mapping):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(*batch)
    return model(batch)


@contextlib.contextmanager
def _evaluating(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode (no running statistics updated), its modes put back after."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _progress(items: Iterable[Any], label: str, show: bool) -> Iterator[Any]:
    """``items``, with a rich progress bar on stderr when ``show`` and rich is installed."""
    if not show:
        yield from items
        return
    try:
        from rich.progress import track
    except ImportError:
        yield from items
        return
    total = len(items) if isinstance(items, Sequence) else None
    yield from track(items, description=label, total=total, transient=True)


def taylor(loss_fn: Callable[[nn.Module, Any], torch.Tensor], batches: Iterable[Any], *,
           progress: bool = False) -> Criterion:
    """First-order Taylor importance: ``Σ |w · ∂L/∂w|`` over each unit's weights in every
    member, the gradients summed over ``batches``.

    ``loss_fn(model, batch)`` returns a scalar loss (e.g. ``F.cross_entropy(model(x), y)`` for
    ``batch = (x, y)``). The model runs in eval mode; its ``.grad`` fields and its modes are
    left as they were.
    """
    def criterion(model: nn.Module, symmap: SymMap) -> dict[str, torch.Tensor]:
        params = dict(model.named_parameters())
        grads = {name: torch.zeros_like(p, dtype=torch.float64) for name, p in params.items()
                 if p.is_floating_point()}
        flags = {name: p.requires_grad for name, p in params.items()}
        seen = 0
        try:
            for name in grads:
                params[name].requires_grad_(True)
            with _evaluating(model):
                for batch in _progress(batches, "Taylor scores", progress):
                    loss = loss_fn(model, batch)
                    names = list(grads)
                    got = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
                    for n, g in zip(names, got):
                        if g is not None:
                            grads[n] += g.detach().double()
                    seen += 1
        finally:
            for name, flag in flags.items():
                params[name].requires_grad_(flag)
        if not seen:
            raise PlanError("taylor importance needs at least one batch")

        def score(name: str, p: torch.Tensor) -> torch.Tensor | None:
            g = grads.get(name)
            return None if g is None else (p.detach().double() * g).abs()

        return element_scores(model, symmap, score)

    return criterion


#: what an activation hook reads: the output (else the input), along one of these dims, and
#: where each group's units lie along it: (positions, units, group name)
_Watch = tuple[bool, set[int], list[tuple[torch.Tensor, torch.Tensor, str]]]


class ActivationRecorder:
    """Mean absolute activations of each group's units, recorded by forward hooks on the
    members of the groups of ``symmap`` while the model (or pieces of it) runs.

    Which tensor and which dim a member shows its units in comes from the analysis alone (the
    member's symbol: a consumer's input for an incoming symbol, a producer's output for an
    outgoing one, along the symbol's dim); nothing is read from module or parameter names.
    ``consumers_only`` keeps the consumers' inputs, Minitron's activation importance: per
    hidden channel the normed residual stream the projections read, per head the attention
    output ``o_proj`` reads, per FFN neuron the input of ``down_proj``.

    :meth:`attach` hooks the members among some modules (all by default), so a model run piece
    by piece (:mod:`fxsym.checkpoint` runs one decoder layer at a time) records the same
    thing; :meth:`scores` gives ``{group name: one score per unit}``, each member's means
    averaged over the ``batches`` it ran and summed over the members.
    """

    def __init__(self, model: nn.Module, symmap: SymMap, *, consumers_only: bool = False
                 ) -> None:
        analysis = symmap.analysis
        if analysis is None:
            raise PlanError("the SymMap holds no analysis; compute it with fxsym.analyze")
        self.modules = dict(model.named_modules())
        groups = {g.id: g for g in symmap.groups()}
        self.sizes = {g.name: g.size for g in groups.values()}
        self.watch: dict[str, list[_Watch]] = {}
        for g in groups.values():
            for qualname, sname in g.members:
                mod = self.modules.get(qualname)
                if mod is None or (qualname, sname) in analysis.param_members or mod not in symmap:
                    continue
                sym = symmap[mod].get(sname)
                if sym is None or not sym.is_cross_layer:
                    continue
                outgoing = sym.cl_type is Symbol.CLType.OUTGOING
                if outgoing and consumers_only:
                    continue
                entries = _unit_entries(symmap, qualname, sname)
                if entries is None:
                    continue
                targets = [(pos, unit, groups[root].name) for root, (pos, unit)
                           in entries.items() if root in groups]
                self.watch.setdefault(qualname, []).append((outgoing, sym.elastic_dims, targets))
        self.sums: dict[tuple[str, int], torch.Tensor] = {}
        self.runs: dict[tuple[str, int], int] = {}

    def _hook(self, qualname: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            for i, (outgoing, dims, _) in enumerate(self.watch[qualname]):
                t = _first_tensor(output) if outgoing else _first_tensor((args, kwargs))
                if t is None or not t.is_floating_point() or t.device.type == "meta":
                    continue
                d = next((d % t.dim() for d in sorted(dims) if -t.dim() <= d < t.dim()), None)
                if d is None:
                    continue
                rest = [x for x in range(t.dim()) if x != d]
                mean = (t.detach().abs().double().mean(rest) if rest else t.detach().abs()
                        ).cpu()
                key = (qualname, i)
                self.sums[key] = mean + self.sums[key] if key in self.sums else mean
                self.runs[key] = self.runs.get(key, 0) + 1
        return hook

    def attach(self, where: Callable[[str], bool] = lambda q: True
               ) -> list[torch.utils.hooks.RemovableHandle]:
        """Hook the watched modules whose qualified names ``where`` accepts; remove the
        handles returned when done."""
        return [self.modules[q].register_forward_hook(self._hook(q), with_kwargs=True)
                for q in self.watch if where(q)]

    def scores(self) -> dict[str, torch.Tensor]:
        """``{group name: one score per unit}`` from what was recorded (zeros where no member
        ran)."""
        totals = {name: torch.zeros(size, dtype=torch.float64)
                  for name, size in self.sizes.items()}
        for (qualname, i), total in self.sums.items():
            for pos, unit, gname in self.watch[qualname][i][2]:
                if int(pos.max()) < total.numel():
                    totals[gname].index_add_(0, unit, total[pos] / self.runs[(qualname, i)])
        return totals


def activation(batches: Iterable[Any], *, progress: bool = False,
               consumers_only: bool = False) -> Criterion:
    """Mean absolute activation: per unit, the mean of ``|x|`` over its entries in every
    member's input (an incoming symbol) or output (an outgoing one), averaged over
    ``batches`` and summed over the members; with ``consumers_only``, the inputs of the
    consumers only (Minitron's activation importance, see :class:`ActivationRecorder`). The
    model runs in eval mode, without gradients.
    """
    def criterion(model: nn.Module, symmap: SymMap) -> dict[str, torch.Tensor]:
        recorder = ActivationRecorder(model, symmap, consumers_only=consumers_only)
        seen = 0
        handles = recorder.attach()
        try:
            with _evaluating(model), torch.no_grad():
                for batch in _progress(batches, "calibration", progress):
                    run_batch(model, batch)
                    seen += 1
        finally:
            for h in handles:
                h.remove()
        if not seen:
            raise PlanError("activation importance needs at least one batch")
        return recorder.scores()

    return criterion


def _first_tensor(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (tuple, list)):
        for v in value:
            t = _first_tensor(v)
            if t is not None:
                return t
    return None


def _unit_entries(symmap: SymMap, qualname: str, sname: str
                  ) -> dict[int, tuple[torch.Tensor, torch.Tensor]] | None:
    """Along the dimension symbol ``qualname.sname`` sizes: per group root, the positions of
    its entries and the unit of each."""
    analysis = symmap.analysis
    dim = None if analysis is None else analysis.symbol_dims.get((qualname, sname))
    if analysis is None or dim is None:
        return None
    table = analysis.table
    out: dict[int, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    offset = 0
    for seg in dim:
        length = seg.units * seg.block
        if seg.group is not None:
            root = table.find(seg.group)
            per_unit = max(seg.units // table.units[root], 1)
            pos = torch.arange(offset, offset + length)
            unit = (pos - offset) // seg.block // per_unit
            entry = out.setdefault(root, ([], []))
            entry[0].append(pos)
            entry[1].append(unit)
        offset += length
    return {root: (torch.cat(p), torch.cat(u)) for root, (p, u) in out.items()}


_NAMED: dict[str, Criterion] = {"l1": l1, "l2": l2, "bn_scale": bn_scale}
#: the criteria named by a string
CRITERIA = tuple(_NAMED)


def criterion_by_name(name: str) -> Criterion:
    """``"l1"``, ``"l2"`` or ``"bn_scale"`` (``taylor`` and ``activation`` need data: call
    them)."""
    found = _NAMED.get(name)
    if found is None:
        data = ("fxsym.importance.taylor(loss_fn, batches) or "
                "fxsym.importance.activation(batches)")
        if name in ("taylor", "activation"):
            raise PlanError(f"importance {name!r} needs data: pass {data}")
        raise PlanError(f"unknown importance {name!r}: by name one of {', '.join(CRITERIA)}; "
                        f"with data {data}; or any callable (model, symmap) -> "
                        "{group name: one score per unit}")
    return found


def unit_scores(group: SymGroup, scores: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
    """The scores of ``group`` from a criterion's result, checked: one float per unit."""
    s = scores.get(group.name)
    if s is None:
        return None
    try:
        s = torch.as_tensor(s).detach().to("cpu", torch.float64).flatten()
    except (TypeError, ValueError, RuntimeError) as exc:
        raise PlanError(f"{group.name}: the importance gave a {type(s).__name__}, not one "
                        "number per unit") from exc
    if s.numel() != group.size:
        raise PlanError(f"{group.name}: the importance gave {s.numel()} scores for "
                        f"{group.size} units")
    return s
