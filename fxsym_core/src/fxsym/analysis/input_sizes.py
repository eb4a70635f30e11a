"""Which sizes of the model's inputs set a dimension of fixed size.

A group pinned because it meets a dimension of fixed size ("meets a dimension of fixed size",
:meth:`fxsym.analysis.context.OpContext.unify`) says nothing about where that size comes from.
Often it is the input's shape: the token dim of a patch embedding is the input's height times
width over the patch size (MLP-Mixer's token MLPs, whose output is that dim), the sequence dim
of a language model is the input's length. No resize can change such a dim; only another
input shape can, and a pin reason that says so tells the user what the ceiling is.

The proof is by running, not by comparing numbers: the graph up to the nodes that hold the
fixed dims runs again on fake tensors (``FakeTensorMode``: shapes only, no memory, no
arithmetic), once per dimension of each tensor input with that dimension doubled. A fixed dim
whose size changes when an input dim changes is set by it. A node that fails (a model that
takes only one size before the dim is made: a reshape to a literal) proves nothing about the
dims that need it, and their reason stays as it was. Only the nodes the fixed dims depend on
run, so a model that takes one size only further down (the token MLP's ``Linear(196, ...)``)
is no obstacle.

The run must not touch the user's model (the traced graph holds the user's own modules): it
calls torch's functions and methods, and modules the caller vouches for (a family with a
SymInfo, in eval mode: a batch norm in training mode counts a batch in its buffer) through
their shadows (:class:`fxsym.tracer.shadow.ShadowTree`: a cache the forward fills is the
shadow's copy, the user's hooks do not run); it proves nothing when the path to a fixed dim
needs anything else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.fx
from torch.fx.node import map_arg

from ..tracer.shadow import ShadowTree
from .layout import TensorLayout

#: the reason :meth:`OpContext.unify` gives a group that meets a dimension of fixed size
FIXED_DIM = "meets a dimension of fixed size"

#: ``(node, dim)``: a dimension of a node's value
NodeDim = tuple[torch.fx.Node, int]
#: ``(placeholder name, dim, size)``: a dimension of a model input
InputDim = tuple[str, int, int]


def fixed_candidates(node: torch.fx.Node, size: int,
                     layouts: dict[torch.fx.Node, Any]) -> list[NodeDim]:
    """The dims of ``node``'s tensor inputs that hold no group and are ``size`` long: where a
    group pinned at ``node`` by :data:`FIXED_DIM` may have met its fixed size."""
    out: list[NodeDim] = []
    for source in node.all_input_nodes:
        layout = layouts.get(source)
        if not isinstance(layout, TensorLayout):
            continue
        for d, dim in enumerate(layout):
            if all(seg.group is None for seg in dim) and sum(s.length for s in dim) == size:
                out.append((source, d))
    return out


def input_dims(gm: torch.fx.GraphModule, targets: Iterable[NodeDim],
               may_call: Callable[[torch.nn.Module], bool]) -> dict[NodeDim, list[InputDim]]:
    """For each target dim, the input dims whose size sets it (see the module docstring);
    a target no input dim was shown to set is left out. ``may_call``: whether a module the
    graph calls may run on fake tensors."""
    targets = list(dict.fromkeys(targets))
    needed = _ancestors([n for n, _ in targets])
    if not all(_harmless(gm, n, may_call) for n in needed):
        needed = set()
        for n, _ in targets:
            path = _ancestors([n])
            if all(_harmless(gm, m, may_call) for m in path):
                needed |= path
        targets = [t for t in targets if t[0] in needed]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder" and n in needed]
    shapes = {n: _tensor_meta(n) for n in placeholders}
    found: dict[NodeDim, list[InputDim]] = {}
    runs = _FakeRuns(gm, needed, shapes)
    for p in placeholders:
        meta = shapes[p]
        if meta is None:
            continue
        for d, size in enumerate(meta.shape):
            values = runs.run((p, d))
            for node, dim in targets:
                value = values.get(node)
                before = _tensor_meta(node)
                if (isinstance(value, torch.Tensor) and before is not None
                        and dim < value.dim() and dim < before.dim()
                        and value.shape[dim] != before.shape[dim]):
                    found.setdefault((node, dim), []).append((p.name, d, int(size)))
    return found


def describe(node: torch.fx.Node, dim: int, inputs: list[InputDim]) -> str:
    """The pin reason of a group that met ``node``'s dim ``dim``, set by ``inputs``."""
    meta = _tensor_meta(node)
    length = int(meta.shape[dim]) if meta is not None else "its"
    names = sorted({name for name, _, _ in inputs})
    where = " and ".join(
        f"dim{'s' if len(ds) > 1 else ''} {', '.join(str(d) for d in ds)} of input {name!r} "
        f"({' x '.join(str(s) for s in sizes)})"
        for name in names
        for ds, sizes in [([d for n, d, _ in inputs if n == name],
                           [s for n, _, s in inputs if n == name])])
    return (f"{FIXED_DIM} set by the input's shape: the {length} entries of dim {dim} of "
            f"{node.name} follow {where}; a different input size changes them, a resize "
            "cannot")


#: the modules whose functions a fake run may call (torch's, and Python's operators)
_PURE = ("torch", "operator", "_operator", "math", "builtins")


def _harmless(gm: torch.fx.GraphModule, node: torch.fx.Node,
              may_call: Callable[[torch.nn.Module], bool]) -> bool:
    """Whether running ``node`` on fake tensors can write nothing outside the run."""
    if node.op in ("placeholder", "get_attr", "call_method"):
        return True
    if node.op == "call_module":
        try:
            return may_call(gm.get_submodule(str(node.target)))
        except AttributeError:
            return False
    if node.op == "call_function":
        home = getattr(node.target, "__module__", None) or ""
        return home.split(".")[0] in _PURE
    return False


def _ancestors(nodes: list[torch.fx.Node]) -> set[torch.fx.Node]:
    seen: set[torch.fx.Node] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def _tensor_meta(node: torch.fx.Node) -> torch.Tensor | None:
    value = node.meta.get("val")
    return value if isinstance(value, torch.Tensor) else None


class _FakeRuns:
    """Runs of the graph's ``needed`` nodes on fake tensors, each with one input dim doubled
    (:meth:`run`). One fake mode for all (the model's tensors are made fake once), a shadow
    per module called, and torch's error log of a failing fake op silenced (a failure is an
    answer here: the node's value is unknown, and so is every value that needs it)."""

    def __init__(self, gm: torch.fx.GraphModule, needed: set[torch.fx.Node],
                 shapes: dict[torch.fx.Node, torch.Tensor | None]) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.gm, self.shapes = gm, shapes
        self.nodes = [n for n in gm.graph.nodes if n in needed]
        self.mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.interpreter = torch.fx.Interpreter(gm)
        self.shadows: dict[str, torch.nn.Module] = {}

    def run(self, grown: tuple[torch.fx.Node, int]) -> dict[torch.fx.Node, Any]:
        """The values of the nodes that ran, with ``grown`` (placeholder, dim) doubled."""
        env: dict[torch.fx.Node, Any] = {}
        log = logging.getLogger("torch._subclasses.fake_tensor")
        level, log.disabled = log.disabled, True
        try:
            with self.mode:
                for node in self.nodes:
                    if all(a in env for a in node.all_input_nodes):
                        try:
                            env[node] = self._value(node, env, grown)
                        except Exception:
                            continue
        finally:
            log.disabled = level
        return env

    def _value(self, node: torch.fx.Node, env: dict[torch.fx.Node, Any],
               grown: tuple[torch.fx.Node, int]) -> Any:
        if node.op == "placeholder":
            meta = self.shapes.get(node)
            if meta is None:  # not a tensor: a value the trace was given
                return node.meta.get("val")
            shape = list(meta.shape)
            if node is grown[0]:
                shape[grown[1]] *= 2
            return torch.zeros(shape, dtype=meta.dtype)
        args = map_arg(node.args, lambda a: env[a])
        kwargs = map_arg(node.kwargs, lambda a: env[a])
        if node.op == "call_module":
            target = str(node.target)
            if target not in self.shadows:
                self.shadows[target] = ShadowTree(self.gm.get_submodule(target)).root
            return self.shadows[target](*args, **kwargs)
        return getattr(self.interpreter, node.op)(node.target, args, kwargs)


__all__ = ["FIXED_DIM", "describe", "fixed_candidates", "input_dims"]
