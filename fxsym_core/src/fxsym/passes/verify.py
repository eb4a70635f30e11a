"""Running a graph on example inputs, comparing outputs, and rolling a pass back.

The pipeline never recompiles between passes, so graphs are run with
:class:`torch.fx.Interpreter` over ``gm.graph`` (the generated code may be stale). Every run
uses the same random seed inside :func:`torch.random.fork_rng`, so random ops draw the same
numbers before and after a pass and the caller's RNG state is untouched.

A :class:`Snapshot` records the graph (a deep copy) and, for every module reachable from the
GraphModule, its attribute dictionaries; :meth:`Snapshot.restore` puts them back. Passes never
write into existing tensors or modules (see :mod:`fxsym.passes.base`), so this is a complete
undo.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx
from torch.fx.passes.shape_prop import ShapeProp

from ..modstate import ModuleTreeState

_SEED = 0x5EED


def normalize_inputs(example_inputs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``example_inputs`` as (args, kwargs): a tuple/list of args, a dict of kwargs, or one
    tensor."""
    if example_inputs is None:
        return (), {}
    if isinstance(example_inputs, Mapping):
        return (), dict(example_inputs)
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def placeholder_values(
    graph: fx.Graph, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[Any]:
    """Positional values for the graph's placeholders (keyword inputs matched by name)."""
    values: list[Any] = []
    remaining = list(args)
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        name = str(node.target)
        if name.startswith("**"):
            values.append({k: v for k, v in kwargs.items()})
        elif name.startswith("*"):
            values.extend(remaining)
            remaining = []
        elif remaining:
            values.append(remaining.pop(0))
        elif name in kwargs:
            values.append(kwargs[name])
        elif node.args:
            values.append(node.args[0])
        else:
            raise TypeError(f"no example input for the graph input {name!r}")
    return values


def _fresh(values: list[Any]) -> list[Any]:
    """Clones of the tensors in ``values``: a graph that writes into an input must not change
    the inputs the next run sees."""
    return [fx.node.map_aggregate(v, lambda t: t.clone() if isinstance(t, torch.Tensor) else t)
            for v in values]


def run_graph(gm: fx.GraphModule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    values = _fresh(placeholder_values(gm.graph, args, kwargs))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(_SEED)
        return fx.Interpreter(gm, graph=gm.graph).run(*values)


def propagate_shapes(gm: fx.GraphModule, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Run the graph once, recording each node's shape and dtype in ``meta['tensor_meta']``."""
    values = _fresh(placeholder_values(gm.graph, args, kwargs))
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(_SEED)
        return ShapeProp(gm).propagate(*values)


def flatten_outputs(value: Any) -> list[Any]:
    """Leaves of a nested output (tuples, lists, dicts, dataclass-like ModelOutputs)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        return [leaf for k in value for leaf in flatten_outputs(value[k])]
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in flatten_outputs(v)]
    return [value]


def compare_outputs(expected: Any, actual: Any, rtol: float, atol: float) -> str | None:
    """``None`` when equal within tolerance, else what differs."""
    exp, act = flatten_outputs(expected), flatten_outputs(actual)
    if len(exp) != len(act):
        return f"the output has {len(act)} values instead of {len(exp)}"
    for i, (e, a) in enumerate(zip(exp, act)):
        if isinstance(e, torch.Tensor) or isinstance(a, torch.Tensor):
            if not (isinstance(e, torch.Tensor) and isinstance(a, torch.Tensor)):
                return f"output {i} changed type: {type(e).__name__} -> {type(a).__name__}"
            try:
                torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
            except AssertionError as err:
                first = str(err).strip().splitlines()
                return f"output {i} differs: " + " ".join(line.strip() for line in first[:4])
        elif e != a:
            return f"output {i} changed: {e!r} -> {a!r}"
    return None


class Snapshot:
    """Everything a pass may change in a GraphModule, ready to be put back: its graph and
    the state of its module tree (:class:`~fxsym.modstate.ModuleTreeState`)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm
        self.graph = copy.deepcopy(gm.graph)
        self.modules = ModuleTreeState(gm)

    def restore(self) -> None:
        self.modules.restore()
        self.gm.graph = self.graph  # the setter recompiles; rollback is the rare path
