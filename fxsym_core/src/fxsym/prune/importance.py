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
  members; needs no parameter. The experts of a mixture-of-experts layer (a routed group)
  are scored by their use instead (:class:`ExpertRecorder`: router load and weighted output,
  Minitron's expert importance).

Long criteria (batches) show a progress bar with ``rich`` when asked and installed.

Imports from fxsym: errors, paramlayout, symbols.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..errors import PlanError
from ..paramlayout import ParamLayout, Slices, layout
from ..paramlayout.slices import LAYOUT_RENAMED
from ..symbols import Symbol, SymGroup, SymMap

__all__ = [
    "CRITERIA",
    "ActivationRecorder",
    "Criterion",
    "ExpertRecorder",
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


if TYPE_CHECKING:
    Layout = ParamLayout  # the deprecated name (see ``__getattr__``), for old annotations
else:
    def __getattr__(name: str) -> Any:
        """``Layout``, the old name of :class:`~fxsym.paramlayout.ParamLayout`, with a
        ``DeprecationWarning``."""
        if name == "Layout":
            warnings.warn(LAYOUT_RENAMED, DeprecationWarning, stacklevel=2)
            return ParamLayout
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


class ExpertRecorder:
    """Per expert of each routed group of ``symmap`` (:attr:`SymGroup.routed`: the experts of
    a mixture-of-experts layer), how much the calibration tokens use it, recorded by forward
    hooks while the model (or pieces of it) runs: Minitron's expert importance.

    The experts are found by what their module is called with, not by names: a module holding
    a member of the group that is called with *positions* into the group (an integer
    ``[tokens, k]`` tensor, every entry below the group's number of experts: the router's
    pick of ``k`` experts per token), the
    *routing weights* (a floating tensor of the same shape) and the tokens' hidden states (a
    floating tensor with one row per token), and returns a tensor shaped like the hidden
    states. Per group and expert ``e``, over the ``N`` tokens it saw:

    * :attr:`load`: ``Σ w / N``, the tokens' routing weights on ``e`` (the share of the
      tokens routed to it, each counted by its weight);
    * :attr:`activation`: ``Σ ‖w · y‖₂ / n``, ModelOpt's Minitron score: the L2 norm of the
      expert's weighted output ``w · y`` over the ``n`` (token, pick) pairs routed to it. The
      outputs ``y`` of each (token, pick) come from one more call of the module on every
      token-pick pair as a row of its own (positions ``[T·k, 1]``, weights 1: the compute of
      the call itself); they are used only if their routing-weighted sum per token gives the
      module's output back (a module applying the weights otherwise, e.g. to its inputs, is
      scored by load alone: :attr:`linear` is false);
    * :meth:`scores`: ``Σ ‖w · y‖₂ / N``, the expert's mean contribution to the layer's
      output per calibration token (ModelOpt's score times the share of picks, so an expert
      seldom picked counts little however large its output); the load where the outputs
      could not be used.

    Where a unit of the group spans several experts (DeepSeek's routing groups,
    :attr:`SymGroup.unit`), the numbers are per unit: its experts' sums.
    """

    def __init__(self, model: nn.Module, symmap: SymMap) -> None:
        self.modules = dict(model.named_modules())
        self.groups = {g.name: g.size for g in symmap.groups() if g.routed and g.size >= 2}
        self.units = {g.name: g.unit for g in symmap.groups() if g.name in self.groups}
        self.owners: dict[str, list[str]] = {}
        for g in symmap.groups():
            if g.name in self.groups:
                for qualname in dict.fromkeys(q for q, _ in g.members):
                    if qualname in self.modules:
                        self.owners.setdefault(qualname, []).append(g.name)
        self.weight: dict[str, torch.Tensor] = {}
        self.output: dict[str, torch.Tensor] = {}
        self.picks: dict[str, torch.Tensor] = {}
        self.tokens: dict[str, int] = {}
        self.linear: dict[str, bool] = {}
        self.inside = False

    def attach(self, where: Callable[[str], bool] = lambda q: True
               ) -> list[torch.utils.hooks.RemovableHandle]:
        """Hook the modules holding a routed group's members whose qualified names ``where``
        accepts; remove the handles returned when done."""
        return [self.modules[q].register_forward_hook(self._hook(q), with_kwargs=True)
                for q in self.owners if where(q)]

    def _hook(self, qualname: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            if self.inside or not isinstance(output, torch.Tensor):
                return
            for gname in self.owners[qualname]:
                found = _routing(args, kwargs, output, self.groups[gname] * self.units[gname])
                if found is not None:
                    self._record(mod, gname, args, kwargs, output, found)
                    return
        return hook

    def _record(self, mod: nn.Module, gname: str, args: tuple[Any, ...],
                kwargs: dict[str, Any], output: torch.Tensor, where: tuple[Any, Any, Any]
                ) -> None:
        x_at, p_at, w_at = where
        x, pos, w = _get(args, kwargs, x_at), _get(args, kwargs, p_at), _get(args, kwargs, w_at)
        size, k = self.groups[gname], pos.shape[-1]
        flat_pos = pos.reshape(-1).long().cpu() // self.units[gname]
        flat_w = w.detach().reshape(-1).double().cpu()
        new = gname not in self.weight
        if new:
            for acc in (self.weight, self.output, self.picks):
                acc[gname] = torch.zeros(size, dtype=torch.float64)
            self.tokens[gname] = 0
            self.linear[gname] = True
        self.weight[gname].index_add_(0, flat_pos, flat_w)
        self.picks[gname].index_add_(0, flat_pos, torch.ones_like(flat_w))
        self.tokens[gname] += pos.numel() // k
        if not self.linear[gname]:
            return
        rows = x.repeat_interleave(k, dim=0)
        one = torch.ones((pos.numel(), 1), dtype=w.dtype, device=w.device)
        a, kw = _put(args, kwargs, {x_at: rows, p_at: pos.reshape(-1, 1), w_at: one})
        self.inside = True
        try:
            y = mod(*a, **kw)
        except Exception:
            y = None
        finally:
            self.inside = False
        if not isinstance(y, torch.Tensor) or y.shape != (pos.numel(), *output.shape[1:]):
            self.linear[gname] = False
            return
        y = y.detach().double().cpu().reshape(pos.numel(), -1)
        weighted = y * flat_w[:, None]
        again = weighted.reshape(-1, k, weighted.shape[-1]).sum(1)
        want = output.detach().double().cpu().reshape(again.shape)
        tolerance = min(0.1, 100 * torch.finfo(output.dtype).eps)
        if float((again - want).norm()) > tolerance * float(want.norm()) + 1e-12:
            self.linear[gname] = False
            return
        self.output[gname].index_add_(0, flat_pos, weighted.norm(dim=1))

    @property
    def load(self) -> dict[str, list[float]]:
        return {g: (w / max(self.tokens[g], 1)).tolist() for g, w in self.weight.items()}

    @property
    def activation(self) -> dict[str, list[float]]:
        return {g: (self.output[g] / self.picks[g].clamp(min=1)).tolist()
                for g in self.weight if self.linear[g]}

    def scores(self) -> dict[str, torch.Tensor]:
        """``{routed group: one score per expert}`` for the groups whose experts ran."""
        return {g: (self.output[g] if self.linear[g] else w) / max(self.tokens[g], 1)
                for g, w in self.weight.items()}


def _routing(args: tuple[Any, ...], kwargs: Mapping[str, Any], output: torch.Tensor,
             size: int) -> tuple[Any, Any, Any] | None:
    """Where a call's hidden states, positions and routing weights are (index in ``args`` or
    keyword), if it was called with positions into a dim of ``size`` (see
    :class:`ExpertRecorder`)."""
    found: list[tuple[int | str, torch.Tensor]] = [
        (i, a) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    found += [(k, v) for k, v in kwargs.items() if isinstance(v, torch.Tensor)]
    for p_at, pos in found:
        if (pos.is_floating_point() or pos.dtype == torch.bool or pos.dim() != 2
                or not pos.numel() or int(pos.min()) < 0 or int(pos.max()) >= size):
            continue
        for w_at, w in found:
            if not (w.is_floating_point() and w.shape == pos.shape):
                continue
            for x_at, x in found:
                if (x_at != w_at and x.is_floating_point() and x.dim() == 2
                        and x.shape[0] == pos.shape[0] and output.shape == x.shape):
                    return x_at, p_at, w_at
    return None


def _get(args: tuple[Any, ...], kwargs: Mapping[str, Any], at: Any) -> torch.Tensor:
    value = args[at] if isinstance(at, int) else kwargs[at]
    assert isinstance(value, torch.Tensor)
    return value


def _put(args: tuple[Any, ...], kwargs: dict[str, Any], values: Mapping[Any, torch.Tensor]
         ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    a = [values.get(i, v) for i, v in enumerate(args)]
    return tuple(a), {k: values.get(k, v) for k, v in kwargs.items()}


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
        self.experts = ExpertRecorder(model, symmap)

    def _hook(self, qualname: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                 output: Any) -> None:
            if self.experts.inside:
                return
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
        """Hook the watched modules whose qualified names ``where`` accepts (and the experts,
        :class:`ExpertRecorder`); remove the handles returned when done."""
        return [self.modules[q].register_forward_hook(self._hook(q), with_kwargs=True)
                for q in self.watch if where(q)] + self.experts.attach(where)

    def scores(self) -> dict[str, torch.Tensor]:
        """``{group name: one score per unit}`` from what was recorded (zeros where no member
        ran); the experts of a routed group by :meth:`ExpertRecorder.scores` where they
        ran."""
        totals = {name: torch.zeros(size, dtype=torch.float64)
                  for name, size in self.sizes.items()}
        for (qualname, i), total in self.sums.items():
            for pos, unit, gname in self.watch[qualname][i][2]:
                if int(pos.max()) < total.numel():
                    totals[gname].index_add_(0, unit,
                                             total.index_select(0, pos) / self.runs[(qualname, i)])
        totals.update(self.experts.scores())
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
