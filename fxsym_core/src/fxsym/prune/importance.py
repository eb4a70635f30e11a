"""Importance: how much each unit of each group matters, scored over every member.

A unit of a group (a channel, an attention head) lives in many tensors: the rows its producers
write, the columns its consumers read, the scales of the norms between them, parameters used
directly in the graph. Every criterion here scores a unit over *all* of them.

**Which slices belong to which unit** is the :class:`~fxsym.paramlayout.ParamLayout`
(:func:`layout`, re-exported from :mod:`fxsym.paramlayout`), derived from the analysis' segments
and the resize rules without copying the model.

**Criteria** are callables ``criterion(model, symmap) -> {group name: scores}`` with one score
per unit (``SymGroup.size`` of them); a group a criterion cannot score is left out:

* :func:`l1`, :func:`l2`: the L1 / L2 norm of all the unit's weights;
* :func:`bn_scale`: the L1 norm of the batch-norm scales (``weight``) of the unit; groups
  without a batch norm are left out;
* :func:`taylor` ``(loss_fn, batches)``: first order Taylor, ``Σ |w · ∂L/∂w|`` over the unit's
  weights, the gradients summed over the batches;
* :func:`activation` ``(batches)``: the mean absolute value of the unit's entries in every
  member's input (consumers) or output (producers) over calibration batches, summed over the
  members; needs no parameter. Groups a plugin scores by their use instead
  (``fxsym_usage_recorder``: the hf plugin's experts of a mixture-of-experts layer, by router
  load and weighted output, Minitron's expert importance) take the plugin's scores.

Long criteria (batches) show a progress bar with ``rich`` when asked and installed.

Imports from fxsym: errors, paramlayout, plugins, symbols.
"""

from __future__ import annotations

import contextlib
import importlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import PlanError
from ..paramlayout import ParamLayout, Slices, layout
from ..paramlayout.slices import LAYOUT_RENAMED
from ..plugins.calls import call_hook
from ..plugins.contracts import UsageRecorder
from ..symbols import Symbol, SymGroup, SymMap

__all__ = [
    "CRITERIA",
    "ActivationRecorder",
    "Criterion",
    "ParamLayout",
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


#: the module's old public names, each kept as a deprecated alias: ``{old name: (the
#: warning, the value)}``: ``Layout``, the old name of :class:`~fxsym.paramlayout.ParamLayout`,
#: and ``ExpertRecorder``, now a plugin's usage recorder (``fxsym_usage_recorder``)
DEPRECATED: dict[str, tuple[str, Callable[[], Any]]] = {
    "Layout": (LAYOUT_RENAMED, lambda: ParamLayout),
    "ExpertRecorder": ("fxsym.importance.ExpertRecorder moved to the hf plugin: "
                       "fxsym_plugins_hf.experts.ExpertRecorder (fxsym_usage_recorder)",
                       lambda: _moved_to_hf("experts", "ExpertRecorder")),
}


def _moved_to_hf(module: str, name: str) -> Any:
    """``name`` of the hf plugin's ``module``, where a deprecated alias of this module now
    points (the plugin is used when present: the core's README)."""
    import fxsym_plugins_hf

    return getattr(importlib.import_module(f"{fxsym_plugins_hf.__name__}.{module}"), name)


if TYPE_CHECKING:
    Layout = ParamLayout  # the deprecated name (see ``__getattr__``), for old annotations
else:
    def __getattr__(name: str) -> Any:
        """The module's old names (:data:`DEPRECATED`), with a ``DeprecationWarning``."""
        if name in DEPRECATED:
            message, value = DEPRECATED[name]
            warnings.warn(message, DeprecationWarning, stacklevel=2)
            return value()
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: ``criterion(model, symmap) -> {group name: one score per unit}``
Criterion = Callable[[nn.Module, SymMap], dict[str, torch.Tensor]]


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
        sums = _sums_along(e.detach().to("cpu", torch.float64), {s.dim for _, s in slices})
        del e
        for gname, s in slices:
            total = totals.get(gname)
            if total is None:
                total = totals[gname] = torch.zeros(lay.sizes[gname], dtype=torch.float64)
            total.index_add_(0, s.unit, sums[s.dim].index_select(0, s.index))
    out: dict[str, torch.Tensor] = {}
    for g in symmap.groups():
        if g.size < 2:
            out[g.name] = torch.ones(1, dtype=torch.float64)
        elif g.name in totals:
            out[g.name] = finish(totals[g.name])
    return out


def _sums_along(e: torch.Tensor, dims: set[int]) -> dict[int, torch.Tensor]:
    """Per dim of ``dims``, the sum of ``e`` over each slice along it. The first two dims (a
    weight's outputs and inputs, the usual case) come from one pass over ``e``; a vector is
    its own sums."""
    if e.dim() == 1:
        return {0: e}
    if dims <= {0, 1}:
        core = e.reshape(e.shape[0], e.shape[1], -1).sum(2) if e.dim() > 2 else e
        return {d: core.sum(1 - d) for d in dims}
    return {d: e.movedim(d, 0).reshape(e.shape[d], -1).sum(1) for d in dims}


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
        return p.detach().to(torch.float64, copy=True).square_()

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
        #: the tensor last measured (held, so its id is not reused), its version, the dim
        #: and its mean (:meth:`_mean`)
        self._last: tuple[torch.Tensor, int, int, torch.Tensor] | None = None
        answers: list[UsageRecorder | None] = call_hook("fxsym_usage_recorder", model=model,
                                                        symmap=symmap)
        #: the plugins' usage recorders (``fxsym_usage_recorder``)
        self.usage = [r for r in answers if r is not None]

    def _hook(self, qualname: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            if any(u.inside for u in self.usage):
                return
            for i, (outgoing, dims, _) in enumerate(self.watch[qualname]):
                t = _first_tensor(output) if outgoing else _first_tensor((args, kwargs))
                if t is None or not t.is_floating_point() or t.device.type == "meta":
                    continue
                d = next((d % t.dim() for d in sorted(dims) if -t.dim() <= d < t.dim()), None)
                if d is None:
                    continue
                mean = self._mean(t, d)
                key = (qualname, i)
                self.sums[key] = mean + self.sums[key] if key in self.sums else mean
                self.runs[key] = self.runs.get(key, 0) + 1
        return hook

    def _mean(self, t: torch.Tensor, d: int) -> torch.Tensor:
        """The mean of ``|t|`` over every dim but ``d``, in float64, on the CPU. Consumers of
        one tensor (an MLP's gate and up projections reading the same normed hidden
        states) are called one after another with that very tensor: the mean of the
        last call is given again while the tensor is the same object, unchanged since
        (``_version``), along the same dim. An inference tensor, which keeps no version, is
        measured each time."""
        last, tracked = self._last, not t.is_inference()
        if tracked and last is not None and last[0] is t and last[1] == t._version \
                and last[2] == d:
            return last[3]
        rest = [x for x in range(t.dim()) if x != d]
        mean = (t.detach().abs().double().mean(rest) if rest else t.detach().abs()).cpu()
        self._last = (t, t._version, d, mean) if tracked else None
        return mean

    def attach(self, where: Callable[[str], bool] = lambda q: True
               ) -> list[torch.utils.hooks.RemovableHandle]:
        """Hook the watched modules whose qualified names ``where`` accepts (and those the
        usage recorders watch); remove the handles returned when done."""
        return [self.modules[q].register_forward_hook(self._hook(q), with_kwargs=True)
                for q in self.watch if where(q)] + [h for u in self.usage for h in u.attach(where)]

    def scores(self) -> dict[str, torch.Tensor]:
        """``{group name: one score per unit}`` from what was recorded (zeros where no member
        ran); the groups a usage recorder scores (the hf plugin: the experts of a routed group,
        where they ran) by its scores."""
        self._last = None  # the run is over: its last activation is not held
        totals = {name: torch.zeros(size, dtype=torch.float64)
                  for name, size in self.sizes.items()}
        for (qualname, i), total in self.sums.items():
            for pos, unit, gname in self.watch[qualname][i][2]:
                if int(pos.max()) < total.numel():
                    totals[gname].index_add_(0, unit,
                                             total.index_select(0, pos) / self.runs[(qualname, i)])
        for u in self.usage:
            totals.update(u.scores())
        return totals

    def records(self) -> dict[str, dict[str, list[float]]]:
        """What the usage recorders record beside their scores (``{name: {group: one number
        per unit}}``, the hf plugin's ``expert_load`` and ``expert_activation``), for the
        plan's ``extra``."""
        out: dict[str, dict[str, list[float]]] = {}
        for u in self.usage:
            for name, record in u.records().items():
                out.setdefault(name, {}).update(record)
        return out


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
