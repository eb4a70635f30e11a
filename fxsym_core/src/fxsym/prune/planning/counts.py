"""Parameter and MAC counts of a model once its groups keep so many units.

Parameters come from the :class:`~fxsym.paramlayout.ParamLayout` (each parameter's
shape once groups keep so many units, without resizing anything: :func:`param_shapes`). MACs
come from the traced graph (``node.meta["val"]``): a call of a module holding parameters of two
or more dims costs each of their elements once per output position (the output's entries over
its feature dim), so a conv, a linear and the projections inside an attention leaf are counted
and shrink with the plan; an embedding (integer input) costs nothing; a ``matmul``/``bmm``
between activations costs ``output entries x inner dim`` at its traced size, which a plan does
not reduce (the attention scores inside a leaf are not counted).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from ...errors import PlanError
from ...paramlayout import layout
from ...symbols import SymMap


@dataclass(frozen=True)
class _MacModel:
    """MACs as ``fixed + Σ positions x elements of its parameters``, over module calls:
    ``weights`` is, per parameter, the positions of all the calls using it."""

    fixed: int
    weights: Mapping[str, int]

    def count(self, shapes: Mapping[str, tuple[int, ...]]) -> int:
        return self.fixed + sum(w * math.prod(shapes[p]) for p, w in self.weights.items())


#: the targets of a product of two tensors (matmul and bmm, as functions, operators and methods)
MATMULS = frozenset({torch.matmul, torch.bmm, operator.matmul, "matmul", "bmm"})


def _mac_model(model: nn.Module, symmap: SymMap) -> _MacModel:
    graph = symmap.graph
    if graph is None:
        raise PlanError("the SymMap holds no traced graph; compute it with fxsym.analyze")
    names = {id(p): n for n, p in model.named_parameters()}
    modules = dict(model.named_modules())
    fixed = 0
    weights: dict[str, int] = {}
    for node in graph.nodes:
        out = _value(node)
        if out is None:
            continue
        if node.op == "call_module":
            mod = modules.get(str(node.target))
            if mod is None:
                continue
            params = [p for p in mod.parameters() if p.dim() >= 2 and id(p) in names]
            first = _value(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) \
                else None
            if not params or (first is not None and not first.is_floating_point()):
                continue  # nothing to multiply, or a lookup (an embedding)
            lead = params[0].shape[0]
            dims = [d for d in (1, -1) if out.dim() > max(d, -d - 1) and out.shape[d] == lead]
            feature = out.shape[dims[0]] if dims else (out.shape[-1] if out.dim() else 1)
            positions = out.numel() // max(int(feature), 1)
            for p in params:
                weights[names[id(p)]] = weights.get(names[id(p)], 0) + positions
        elif node.op in ("call_function", "call_method") and node.target in MATMULS:
            first = _value(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) \
                else None
            if first is not None and first.dim():
                fixed += out.numel() * int(first.shape[-1])
    return _MacModel(fixed, weights)


def _value(node: Any) -> torch.Tensor | None:
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)) and val:
        val = val[0]
    return val if isinstance(val, torch.Tensor) else None


def count_macs(model: nn.Module, symmap: SymMap, kept: Mapping[str, int] | None = None) -> int:
    """The MACs of one call of ``model`` on its traced example inputs, once each group of
    ``kept`` keeps that many units (see the module docstring for what is counted)."""
    lay = layout(model, symmap)
    return _mac_model(model, symmap).count(lay.shapes_after(kept or {}))


def param_shapes(model: nn.Module, symmap: SymMap
                 ) -> Callable[[Mapping[str, int]], Mapping[str, tuple[int, ...]]]:
    """``shapes(sizes)``: every parameter's shape once the groups of ``sizes`` (``{group name:
    units kept}``) keep that many units, the others whole; the layout is learned once."""
    return layout(model, symmap).shapes_after
