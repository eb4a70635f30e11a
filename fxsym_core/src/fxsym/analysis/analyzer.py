"""The analyzer: one pass over the traced graph, in topological order.

For every value it keeps a layout (see :mod:`fxsym.analysis.layout`). Placeholders are
fixed; parameters used directly (``get_attr``) start groups with no producer, which become
parameter members if an op ties them to a real group, and producers where an op rule proves
that a parameter dim makes the entries of its output dim (:meth:`OpContext.produce`:
``F.linear``, ``F.conv2d``, ``F.embedding`` of a module traced into). A ``call_module`` node
of a module with a SymInfo ties its INCOMING
symbols to the groups of its first input and starts a new group for each OUTGOING symbol
(a shape-preserving module passes its input layout through). ``call_function`` and
``call_method`` nodes follow the op rules plugins registered. Anything else — an unknown op,
an unknown module, a rule that cannot prove its mapping — is a *boundary*: the groups it
touches become constant. Groups reaching the graph output become constant too.

This module holds the walk (guards applied once their reads have layouts, the hook sites and
the outputs pinned, positions checked), the op rules' dispatch and the modules with a
SymInfo; the :class:`Analyzer` is one object whose other parts are classes of their own
modules over the state they share (:mod:`.state`): :mod:`.parameter_reads`,
:mod:`.attribute_reads`, :mod:`.explain`. :mod:`.alternatives` runs it.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from ..errors import PluginError
from ..naming import qualname
from ..symbols import Symbol
from ..tracer.questions import ATTRIBUTE_META
from .attribute_reads import AttributeReads
from .attributes import check_uses
from .context import OpContext, Unsupported
from .explain import Explanations
from .guards import Decision, EachPair, Pin, TieSizes, Unify, decide, due_guards
from .layout import Dim, Layout, Seg, TensorLayout, dim_size, fixed_layout, group_dim, iter_dims
from .outputs import output_keys, select_outputs
from .parameter_reads import ParameterReads
from .shared import tie_shared_tensors


def resolve_dim(elastic_dims: set[int], ndim: int) -> int | None:
    """The one dimension the equivalent indices ``elastic_dims`` name for a tensor of ``ndim``."""
    if len(elastic_dims) == 1:  # the usual case, without building a set
        for d in elastic_dims:
            return d % ndim if -ndim <= d < ndim else None
    found = {d % ndim for d in elastic_dims if -ndim <= d < ndim}
    return found.pop() if len(found) == 1 else None


def _batch_dims(ctx: OpContext, info: Any, shape: tuple[int, ...], consumed: set[int]
                ) -> set[int]:
    """The input dims a leaf module passes to its output unchanged: with
    ``info.leading_dims_are_batch``, every dim before the last that no symbol reads, where
    the output is one tensor of the input's rank and the dim keeps its size."""
    if not info.leading_dims_are_batch or not isinstance(ctx.value, torch.Tensor):
        return set()
    out = ctx.out_shape()
    if len(shape) != len(out):
        return set()
    return {d for d in range(len(shape) - 1) if d not in consumed and shape[d] == out[d]}


class Analyzer(ParameterReads, AttributeReads, Explanations):
    """Propagates layouts through a GraphModule and collects symbol dims for a SymMap."""

    # -- driver ----------------------------------------------------------------------------
    def run(self) -> None:
        due = due_guards(self.gm.graph)
        for node in self.gm.graph.nodes:
            if ATTRIBUTE_META in node.meta:  # a get_attr, or an element of a tuple read
                self.env[node] = self._attribute(node)
            elif node.op == "get_attr":
                self.env[node] = self._parameter(node)
            elif node.op == "placeholder":
                self.env[node] = fixed_layout(node.meta.get("val"))
            elif node.op == "output":
                self._fix_outputs(node)
            else:
                self.env[node] = self._visit(node)
            for guard in due.get(node, ()):  # its reads have layouts now
                self._apply_guard(decide(guard, self.env, self.table), node)
        self._pin_hook_sites()
        if self.config_reads:
            self._hidden_config_readers()
        resolve = self.table.resolve_layout  # read groups split since as their blocks
        self.symbol_dims = {k: resolve(d) for k, d in self.symbol_dims.items()}
        self.param_reads = {k: resolve(v) for k, v in self.param_reads.items()}
        shared = tie_shared_tensors(self)
        self.symbol_dims.update(shared.symbol_dims)
        self.param_members |= shared.param_members

    def _apply_guard(self, decision: Decision, at: torch.fx.Node) -> None:
        """Apply what :func:`fxsym.analysis.guards.decide` decided of a guard whose last read
        is ``at``."""
        if isinstance(decision, Pin):
            changed = False
            for d in decision.dims:
                changed |= self.fix(d, decision.reason)
                self.pin_sites.extend((s.group, decision.where, decision.reason) for s in d
                                      if s.group is not None)
            if changed and decision.report:
                self.report.add("guard", decision.where, decision.reason)
        elif isinstance(decision, Unify):
            try:
                OpContext(self, at).unify(decision.a, decision.b)
            except Unsupported:
                self._apply_guard(decision.otherwise, at)
        elif isinstance(decision, TieSizes):
            self.table.tie_sizes(decision.a, decision.b)
        elif isinstance(decision, EachPair):
            for pair in decision.guards:  # each decided once the one before is applied
                self._apply_guard(decide(pair, self.env, self.table), at)

    def _pin_hook_sites(self) -> None:
        """Pin the groups of the inputs and outputs of every call of a module whose hooks the
        trace does not see, and of the module's own sizes (:mod:`fxsym.tracer.hooksites`)."""
        sites = getattr(self.gm, "hook_sites", ())
        if not sites:
            return
        nodes = {n.name: n for n in self.gm.graph.nodes}
        for site in sites:
            names = site.inputs + site.outputs
            dims = [d for n in names if n in nodes
                    for d in iter_dims(self.env.get(nodes[n]))]
            dims += [d for (q, _), d in self.symbol_dims.items() if q == site.path]
            reason = site.reason
            for dim in dims:
                for seg in dim:
                    if seg.group is not None and self.table.fix(seg.group, reason):
                        self.pin_sites.append((seg.group, site.path, reason))

    def _fix_outputs(self, node: torch.fx.Node) -> None:
        """Groups reaching an output of the contract are constant; the contract is resolved
        to the keys the traced output has."""
        structure = node.args[0]
        contract = self.contract
        if contract is not None:
            present = output_keys(structure)
            kept = [k for k in contract if k in present or (
                isinstance(k, int) and -len(present) <= k < len(present))]
            if not kept and not self.strict_contract:
                contract = None  # a plugin's default that names none of these outputs
            else:
                select_outputs(structure, contract, strict=self.strict_contract)
                contract = tuple(kept)
        self.contract = contract
        picked = select_outputs(structure, contract)
        nodes: list[torch.fx.Node] = []
        torch.fx.node.map_arg(picked, nodes.append)
        self.fix(tuple(self.env.get(n) for n in nodes), "reaches the model output", node)
        for n in nodes:
            found = self.positions.get(n)
            for dim in (found.values() if isinstance(found, dict) else [found]):
                if dim is not None:
                    self.fix(self.table.resolve(dim), f"{self.position_origins[n]} returns "
                             "positions along an elastic dim, which reach the model output",
                             node)
        if contract is not None:
            others = [k for k in output_keys(structure) if k not in contract]
            if others:
                self.report.add("outputs", "output", f"outside the output contract {contract}, "
                                f"free to change size: {others}")

    def _visit(self, node: torch.fx.Node) -> Layout:
        ctx = OpContext(self, node)
        layout = self._visit_rule(ctx)
        if ctx.node in self.boundaries:  # a rule that gave up maps no positions either
            ctx.positions_taken.clear()
            ctx.positions_given = None
        if self.positions or ctx.positions_given is not None:
            self._check_positions(ctx)
        return layout

    def _check_positions(self, ctx: OpContext) -> None:
        """Pin the dims indexed by positions among the node's inputs that its rule did not map
        (:meth:`OpContext.take_positions`); an item of a tuple of values read by index or name
        (``topk(...)[1]``, ``.indices``) holds that item's positions."""
        node = ctx.node
        origin = _op_name(node)
        for arg in node.all_input_nodes:
            found = self.positions.get(arg)
            if found is None:
                continue
            origin = self.position_origins[arg]
            if arg in ctx.positions_taken:
                continue
            if isinstance(found, dict) and node.args and node.args[0] is arg and len(
                    node.args) == 2 and (node.target is operator.getitem or (
                    node.target is getattr)) and isinstance(node.args[1], (int, str)):
                item = found.get(node.args[1])
                if item is not None:
                    self.positions[node] = item
                    self.position_origins[node] = origin
                continue
            dims = list(found.values()) if isinstance(found, dict) else [found]
            for dim in dims:
                self.fix(self.table.resolve(dim), f"{origin} returns positions along an "
                         f"elastic dim, which {_op_name(node)} reads as numbers", node)
        if ctx.positions_given is not None:
            self.positions[node] = ctx.positions_given
            self.position_origins[node] = origin

    def _visit_rule(self, ctx: OpContext) -> Layout:
        node = ctx.node
        if "val" not in node.meta:
            return self.boundary(node, "its value is unknown at trace time")
        if any(self.env.get(n) is None and isinstance(n.meta.get("val"), torch.Tensor)
               for n in node.all_input_nodes):
            return self.boundary(node, "an input has no known layout")
        try:
            if node.op == "call_module":
                result = self._visit_module(ctx)
            else:
                rule = self.registry.op_rule(node.target)
                if rule is None:
                    return self.boundary(node, f"no op rule for {qualname(node.target)}")
                result = rule(ctx)
            check_uses(ctx, result)
            return result
        except Unsupported as exc:
            return self.boundary(node, str(exc) or "unsupported")
        except PluginError:  # strict mode: a failing plugin stops the analysis
            raise
        except Exception as exc:  # a broken rule costs precision, never correctness
            return self.boundary(node, f"op rule failed: {type(exc).__name__}: {exc}")

    # -- modules ---------------------------------------------------------------------------
    def _visit_module(self, ctx: OpContext) -> Layout:
        node = ctx.node
        qualname = str(node.target)
        mod = self.modules(qualname)
        if mod not in self.symmap:
            return self.boundary(node, f"no SymInfo for module {type(mod).__name__}")
        info = self.symmap.sym_info(mod)
        name = self.symmap.name_of(mod)
        tensors = [a for a in node.args if isinstance(ctx.layout(a), TensorLayout)]
        tensors += [a for a in node.kwargs.values() if isinstance(ctx.layout(a), TensorLayout)]
        if not tensors:
            return self.boundary(node, f"{type(mod).__name__} got no tensor input")
        x = ctx.tensor_layout(tensors[0])
        if len(tensors) > 1:
            self._extra_inputs(ctx, mod, info, tensors)
        consumed: set[int] = set()
        incoming: dict[int, tuple[Dim, int | None]] = {}
        for sname, sym in info.symbols.items():
            if not sym.is_incoming:
                continue
            d = resolve_dim(sym.elastic_dims, len(x))
            if d is None:
                self.fix(x, f"{name}.{sname}: input of unexpected rank {len(x)}", node)
                continue
            consumed.add(d)
            if sym.is_constant:
                self.fix(x[d], f"{name}.{sname} cannot change", node)
            units = sym.units
            if units and not sym.is_constant and sym.units_stay:
                ctx.runs_alike(x[d], int(units), f"{name}.{sname}")
            elif units and not sym.is_constant and units != dim_size(x[d]):
                ctx.whole_units(x[d], int(units), f"{name}.{sname}")
            self._attach(name, sname, x[d], node)
            incoming[id(sym)] = (x[d], units)
        for sname, sym in info.symbols.items():  # internal searchable sizes (heads, ...)
            size = sym.size
            if not sym.is_cross_layer and sym.is_searchable and size and (
                    (name, sname) not in self._out_groups):
                self._outgoing(name, sname, sym, size * sym.block)
        if info.is_shape_preserving:
            if ctx.shape(tensors[0]) != ctx.out_shape():
                ctx.unsupported(f"shape-preserving {type(mod).__name__} changed the shape")
            return x
        batch = _batch_dims(ctx, info, ctx.shape(tensors[0]), consumed)
        for d, dim in enumerate(x):
            if d not in consumed and d not in batch:
                self.fix(dim, f"{type(mod).__name__} maps input dim {d} in an unknown way", node)
        out = ctx.fixed()
        if isinstance(out, tuple) and not isinstance(out, TensorLayout) and out and isinstance(
                out[0], TensorLayout):  # (output, extras...): symbols size the first
            out = (self._outputs(ctx, name, info, incoming, out[0], ctx.value[0]), *out[1:])
        elif isinstance(out, TensorLayout):
            out = self._outputs(ctx, name, info, incoming, out, ctx.value)
            out = TensorLayout(x[d] if d in batch else o for d, o in enumerate(out))
        return self._places(ctx, name, info, out)

    def _extra_inputs(self, ctx: OpContext, mod: torch.nn.Module, info: Any,
                      tensors: list[Any]) -> None:
        """Pin the tensor inputs of a leaf after its first (but the same value again, and
        the dim a symbol's ``places`` names)."""
        node = ctx.node
        placed = {path[0]: path[-1] for sym in info.symbols.values()
                  for kind, path in sym.places if kind == "input" and len(path) == 2}
        where: dict[int, int | str] = {id(a): i for i, a in enumerate(node.args)}
        where.update((id(a), k) for k, a in node.kwargs.items())
        for other in tensors[1:]:
            if other is tensors[0]:  # self-attention passes one value three times
                continue
            lay = ctx.tensor_layout(other)
            last = placed.get(where.get(id(other), -1))
            free = resolve_dim({last}, len(lay)) if isinstance(last, int) else None
            self.fix(TensorLayout(d for i, d in enumerate(lay) if i != free),
                     f"extra input of {type(mod).__name__}", node)

    def _places(self, ctx: OpContext, name: str, info: Any, out: Layout) -> Layout:
        """Tie the input dims and lay out the output dims a symbol's ``places`` name (one
        copy of its group each); an input dim that cannot be tied pins both."""
        for sname, sym in info.symbols.items():
            dim = self.symbol_dims.get((name, sname))
            if not sym.places or dim is None:
                continue
            one = dim[:len(dim) // sym.copies]
            for kind, path in sym.places:
                if kind == "input":
                    at, *inner, last = path
                    args, kwargs = ctx.node.args, ctx.node.kwargs
                    lay = (ctx.layout(kwargs.get(at)) if isinstance(at, str) else
                           ctx.layout(args[at]) if at < len(args) else None)
                    for i in inner:
                        lay = lay[i] if isinstance(lay, tuple) and isinstance(i, int) and (
                            -len(lay) <= i < len(lay)) else None
                    if not isinstance(lay, TensorLayout) or not lay or isinstance(last, str):
                        continue
                    d = resolve_dim({last}, len(lay))
                    try:
                        if d is None:
                            raise Unsupported("no such dim")
                        ctx.unify(lay[d], one)
                    except Unsupported:
                        why = f"{name}.{sname}: an input of another size"
                        self.fix(lay, why, ctx.node)
                        self.fix(one, why, ctx.node)
                else:
                    placed = _place(out, tuple(int(i) for i in path), one)
                    if placed is None:
                        self.fix(one, f"{name}.{sname}: an output of another size", ctx.node)
                    else:
                        out = placed
        return out

    def _outputs(self, ctx: OpContext, name: str, info: Any,
                 incoming: dict[int, tuple[Dim, int | None]],
                 out: TensorLayout, value: torch.Tensor) -> TensorLayout:
        dims = list(out)
        shape = tuple(value.shape)
        for sname, sym in info.symbols.items():
            if not sym.is_outgoing:
                continue
            d = resolve_dim(sym.elastic_dims, len(dims))
            if d is None:
                continue
            found = incoming.get(id(sym.parent)) if sym.parent is not None else None
            if found is not None:  # follows an input dim (depthwise and grouped convs)
                source, units = found
                if dim_size(source) != shape[d]:
                    seg = source[0]
                    if not (units and len(source) == 1 and shape[d] % units == 0):
                        ctx.unsupported(f"{name}.{sname} follows an input dim of another size")
                    source = (Seg(seg.group, units, shape[d] // units),)
                self._attach(name, sname, source, ctx.node)
                dims[d] = source
                continue
            copies = sym.copies
            if shape[d] % copies:
                ctx.unsupported(f"{name}.{sname}: {shape[d]} entries are not {copies} copies")
            dims[d] = self._outgoing(name, sname, sym, shape[d] // copies) * copies
            self.symbol_dims[(name, sname)] = dims[d]
        return TensorLayout(dims)

    def _attach(self, name: str, sname: str, dim: Dim, node: torch.fx.Node) -> None:
        key = (name, sname)
        old = self.symbol_dims.get(key)
        if old is not None:  # a module called more than once: every call must agree
            old = self.table.resolve(old)
            ctx = OpContext(self, node)
            try:
                dim = ctx.unify(old, dim)
            except Unsupported:
                self.fix(old, f"{name} is called with different layouts", node)
                self.fix(dim, f"{name} is called with different layouts", node)
        self.symbol_dims[key] = dim

    def _outgoing(self, name: str, sname: str, sym: Symbol, size: int) -> Dim:
        key = (name, sname)
        block = sym.block
        g = self._out_groups.get(key)
        if g is None:
            g = self.table.new(size // block)
            self._out_groups[key] = g
            self.table.add_producer(g, name, sname, sym.is_searchable)
            if not sym.is_searchable:
                self.table.fix(g, f"{name}.{sname} is not searchable")
            if size % block:
                self.table.fix(g, f"{name}.{sname}: size {size} is not a multiple of {block}")
        dim = group_dim(g, size // block, block)
        self.symbol_dims[key] = dim
        return dim


def _place(layout: Layout, path: tuple[int, ...], dim: Dim) -> Layout | None:
    """``layout`` with the tensor dim at ``path`` (indices into nested tuples, then the dim)
    replaced by ``dim``; unchanged where the output has no such place, ``None`` where the dim
    there is not ``dim``'s size."""
    if len(path) == 1:
        if not isinstance(layout, TensorLayout) or not layout:
            return layout
        d = resolve_dim({path[0]}, len(layout))
        if d is None or dim_size(layout[d]) != dim_size(dim):
            return None
        return TensorLayout(dim if i == d else x for i, x in enumerate(layout))
    if isinstance(layout, TensorLayout) or not isinstance(layout, tuple) or not (
            -len(layout) <= path[0] < len(layout)):
        return layout
    inner = _place(layout[path[0]], path[1:], dim)
    if inner is None:
        return None
    items = list(layout)
    items[path[0]] = inner
    return tuple(items)


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"module {node.target}"
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


__all__ = ["Analyzer", "resolve_dim"]
