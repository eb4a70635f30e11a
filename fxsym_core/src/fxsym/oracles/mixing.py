"""Which module calls mix the units they read: where dropping units is not zeroing them.

Every module call that meets a dropped group is run once more, resized, on its recorded input
in the full copy with the dropped entries taken out, and must give that call's recorded
output with them taken out. A per-channel module (a batch norm, a depthwise conv) and a linear
reader pass; a layer norm over the group's dim, an attention module whose output channels
read every head do not. Modules are probed, not named. The records are copied once per tensor
and version (``_Snapshots``): those of every call of a large model are as large as its
weights.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ..symbols import SymGroup, SymMap
from .perturb import PerturbedCopy
from .precision import _Precision
from .valueplan import _Call, _ValuePlan
from .zeroing import _kept, _zero_reads


def _mixing_modules(model: nn.Module, symmap: SymMap, example_inputs: Any, plan: _ValuePlan,
                    seed: int, precision: _Precision, drops: list[tuple[SymGroup, list[int]]]
                    ) -> dict[int, str]:
    """The groups met by a module call where dropping units is not zeroing them, with the
    reason: every module call that meets a dropped group is run once more, resized, on its
    input in the full copy with the dropped entries taken out, and must give that call's
    output with them taken out. A per-channel module (a batch norm, a depthwise conv) and a
    linear reader (a conv, a linear: its input is zeroed where the group is read) pass; a
    layer norm over the group's dim, an attention module whose output channels read every head
    do not. Modules are probed, not named."""
    analysis = symmap.analysis
    assert analysis is not None
    table = analysis.table
    dropped = {g.id: torch.tensor(units) for g, units in drops}
    probed = [c for c in plan.calls if c.roots & dropped.keys()]
    if not probed:
        return {}
    records: dict[tuple[str, int], tuple[Any, Any, Any]] = {}

    def recorded_run() -> list[torch.Tensor]:
        records.clear()
        with PerturbedCopy(model, seed, symmap, precision.dtype) as full:
            modules = dict(full.model.named_modules())
            handles = _zero_reads(full.model, plan, dropped, table)
            copies = _Snapshots()
            for target in {c.target for c in probed}:
                if target in modules:
                    handles += _recorder(modules[target], target, records, copies)
            try:
                return precision.forward(full.model, example_inputs, symmap.output_contract)
            finally:
                for h in handles:
                    h.remove()

    precision.run(recorded_run)
    keep = {g.name: [u for u in range(g.size) if u not in set(units)] for g, units in drops}
    try:
        small = PerturbedCopy(model, seed, symmap, precision.dtype, keep)
    except Exception:
        return {}  # the comparison reports it
    with small:
        return _probe(small.model, probed, records, table, dropped, precision)


def _probe(small: nn.Module, probed: list[_Call],
           records: dict[tuple[str, int], tuple[Any, Any, Any]], table: Any,
           dropped: dict[int, torch.Tensor], precision: _Precision) -> dict[int, str]:
    """:func:`_mixing_modules`' comparison of each probed call of the resized copy
    ``small`` with its ``records``."""
    modules = dict(small.named_modules())
    mixing: dict[int, str] = {}
    for c in probed:
        record = records.get((c.target, c.call))
        mod = modules.get(c.target)
        if record is None or mod is None:
            continue
        args, kwargs, output = record
        try:
            with torch.no_grad():
                got = mod(*(_kept(a, c.args.get(i), table, dropped) for i, a in enumerate(args)),
                          **{k: _kept(v, c.args.get(k), table, dropped)
                             for k, v in kwargs.items()})
            same = _same_tree(got, _kept(output, c.output, table, dropped),
                              precision.tolerance)
        except Exception:
            same = False
        if not same:
            for root in sorted(c.roots & dropped.keys()):
                mixing.setdefault(root, f"{c.target} ({type(mod).__name__}) mixes the units "
                                        "it reads: dropping them is not zeroing them there")
    return mixing


class _Snapshots:
    """Copies of the tensors the probed calls see, one per tensor and version: the output of
    a call that the next probed call reads unchanged (a linear's output into its activation)
    is copied once. The records of every call of a large model are as large as its weights
    (vit_b_16 at 224: 0.7 GB in float64)."""

    def __init__(self) -> None:
        self._copies: dict[int, tuple[weakref.ref[torch.Tensor], int, torch.Tensor]] = {}

    def __call__(self, value: Any) -> Any:
        return pytree.tree_map(self._copy, value)

    def _copy(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        hit = self._copies.get(id(t))
        if hit is not None and hit[0]() is t and hit[1] == t._version:
            return hit[2]
        copied = t.clone()
        self._copies[id(t)] = (weakref.ref(t), t._version, copied)
        return copied


def _recorder(mod: nn.Module, target: str,
              records: dict[tuple[str, int], tuple[Any, Any, Any]],
              copied: _Snapshots) -> list[Any]:
    """Hooks recording each call's inputs (as the module gets them, after the zeroing
    pre-hooks) and output, copied (:class:`_Snapshots`): an in-place module
    (``ReLU(inplace=True)``) or op downstream rewrites them."""
    calls: list[tuple[Any, Any]] = []

    def before(mod: nn.Module, args: Any, kwargs: Any) -> None:
        calls.append(copied((args, kwargs)))

    def after(mod: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        call = len(outputs)
        outputs.append(copied(output))
        records[(target, call)] = (*calls[call], outputs[call])

    outputs: list[Any] = []

    return [mod.register_forward_pre_hook(before, with_kwargs=True),
            mod.register_forward_hook(after, with_kwargs=True)]


def _same_tree(a: Any, b: Any, tol: float) -> bool:
    xs = [t for t in pytree.tree_leaves(a) if isinstance(t, torch.Tensor)]
    ys = [t for t in pytree.tree_leaves(b) if isinstance(t, torch.Tensor)]
    return len(xs) == len(ys) and all(
        x.shape == y.shape and torch.allclose(
            x.double(), y.double(), rtol=tol,
            atol=tol * max(1.0, float(y.double().abs().max()) if y.numel() else 1.0))
        for x, y in zip(xs, ys))
