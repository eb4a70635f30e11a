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
"""

from __future__ import annotations

import dataclasses
import functools
import operator
from typing import Any

import torch
import torch.fx
from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

from ..errors import PluginError
from ..naming import qualname
from ..symbols import Symbol, SymMap
from ..tracer.configs import CONFIG_META
from ..tracer.questions import ATTRIBUTE_META
from ..tracer.report import TraceReport
from .attributes import ATTRIBUTE_PREFIX, check_uses
from .context import OpContext, Unsupported
from .groups import GroupTable
from .guards import Decision, EachPair, Pin, TieSizes, Unify, decide, due_guards
from .input_sizes import FIXED_DIM, describe, fixed_candidates, input_dims
from .layout import (
    AttributeSize,
    Dim,
    Layout,
    Seg,
    SizeLayout,
    TensorLayout,
    dim_size,
    fixed_dim,
    fixed_layout,
    group_dim,
    iter_dims,
)
from .options import routing_groups
from .outputs import Contract, output_keys, select_outputs
from .shared import own_tensor, tie_shared_tensors
from .submodules import Submodules


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


class Analyzer:
    """Propagates layouts through a GraphModule and collects symbol dims for a SymMap."""

    def __init__(self, gm: torch.fx.GraphModule, symmap: SymMap, report: TraceReport,
                 contract: Contract | None = None, strict_contract: bool = True,
                 alternatives: frozenset[str] = frozenset()) -> None:
        self.gm = gm
        #: nodes taking their alternative mapping (:meth:`OpContext.offer_alternative`), and
        #: the alternatives offered in this run: (node name, the dim the first mapping keeps)
        self.alternatives = alternatives
        self.offers: list[tuple[str, Dim]] = []
        #: the outputs whose sizes must stay (``None``: every output), and whether a name
        #: missing from the output is an error (a user's contract) or skipped (a plugin's)
        self.contract = contract
        self.strict_contract = strict_contract
        self.symmap = symmap
        self.report = report
        self.table = GroupTable()
        self.env: dict[torch.fx.Node, Layout] = {}
        #: values that are positions along a dim (see :mod:`fxsym.analysis.context`), and
        #: the op that returned them first
        self.positions: dict[torch.fx.Node, Any] = {}
        self.position_origins: dict[torch.fx.Node, str] = {}
        #: the nodes made boundaries
        self.boundaries: set[torch.fx.Node] = set()
        #: (module_qualname, symbol_name) -> the Dim that symbol sizes
        self.symbol_dims: dict[tuple[str, str], Dim] = {}
        self._out_groups: dict[tuple[str, str], int] = {}
        #: keys of ``symbol_dims`` that are parameter members, not symbols
        self.param_members: set[tuple[str, str]] = set()
        #: layout of each parameter or buffer read with ``get_attr``, by target
        self.param_reads: dict[str, Layout] = {}
        self._member_keys: dict[str, list[tuple[str, str]]] = {}
        #: layout of each int attribute read as a size, by target, and the groups they start
        self.attribute_reads: dict[str, Layout] = {}
        self.attribute_groups: set[int] = set()
        #: layout of each config field read as a size, by ``(id(config), field)``
        self.config_reads: dict[tuple[int, str], Layout] = {}
        #: the modules that read each config field, by ``(id(config), field)``
        self.config_readers: dict[tuple[int, str], set[str]] = {}
        #: (group id, where, reason) of every fix that made a group constant, in order
        self.pin_sites: list[tuple[int, str, str]] = []
        #: (node, group, size) of every group pinned where it met a dim of fixed size
        self.fixed_meets: list[tuple[torch.fx.Node, int, int]] = []
        #: per (where, reason) of a boundary line: whether it pinned only numbers that size no
        #: tensor (see :meth:`fix`)
        self.number_sites: dict[tuple[str, str], bool] = {}
        self.registry = symmap.registry
        #: the submodules of the traced GraphModule and of the model, by path
        self.modules = Submodules(gm)
        self.model_modules = Submodules(symmap.model)

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

    def _parameter(self, node: torch.fx.Node) -> Layout:
        known = self.param_reads.get(str(node.target))  # read twice: the same groups
        if known is None:
            known = self.param_reads[str(node.target)] = self._new_parameter(node)
        return known

    def _attribute(self, node: torch.fx.Node) -> Layout:
        """An int attribute of a module read as a size (see :mod:`fxsym.analysis.attributes`):
        a group of its own whose member is ``(owner, "attr:name")`` (``"attr:name[i]"`` for
        element ``i`` of a tuple of ints). Questions Python asked of its value at trace time
        are guards, decided once their reads have layouts (:mod:`fxsym.analysis.guards`).
        Every read of one attribute has the same layout."""
        owner, name = node.meta[ATTRIBUTE_META]
        target = f"{owner}.{name}" if owner else name
        known = self.attribute_reads.get(target)
        shared = node.meta.get(CONFIG_META)  # one field of one config object: one group
        if shared is not None:
            self.config_readers.setdefault(shared, set()).add(node.meta[ATTRIBUTE_META][0])
        if known is None and shared in self.config_reads:
            known = self.attribute_reads[target] = self.config_reads[shared]
            if isinstance(known, AttributeSize):
                self._attribute_member(node, known[0])
        if known is None:
            value = node.meta.get("val")
            if isinstance(value, tuple):  # read element by element: each is a size
                known = fixed_layout(value)
            elif not isinstance(value, int) or value <= 1:
                known = SizeLayout((fixed_dim(int(value or 0)),))
            else:
                g = self.table.new(value)
                dim = group_dim(g, value)
                self._attribute_member(node, dim)
                self.attribute_groups.add(g)
                known = AttributeSize((dim,))
            self.attribute_reads[target] = known
            if shared is not None:
                self.config_reads[shared] = known
        return known

    def _hidden_config_readers(self) -> None:
        """Pin the config fields read as sizes whose config object a module called as a leaf
        (or a module inside one) also holds: its forward, which fxsym does not see, would read
        the resized value too. A field read by several modules is one group; say so where it
        is pinned."""
        ids = {key[0] for key in self.config_reads}
        hidden: dict[int, str] = {}
        for node in self.gm.graph.nodes:
            if node.op != "call_module":
                continue
            for sub_name, sub in self.modules(str(node.target)).named_modules():
                for value in vars(sub).values():
                    if id(value) in ids:
                        hidden.setdefault(id(value), f"{node.target}.{sub_name}".rstrip("."))
        for (cid, field), layout in self.config_reads.items():
            readers = ", ".join(sorted(self.config_readers.get((cid, field), ())) or ["<root>"])
            groups = [seg.group for d in iter_dims(layout) for seg in d if seg.group is not None]
            if cid in hidden:
                reason = (f"config field {field} (read as a size by {readers}) is held by "
                          f"{hidden[cid]}, a leaf whose forward fxsym does not see")
                if any([self.table.fix(g, reason) for g in groups]):
                    self.report.add("config", field, reason)
            elif len(self.config_readers.get((cid, field), ())) > 1:
                why = next((r for g in groups if (r := self.table.reason(g))), None)
                if why is not None:
                    self.report.add("config", field, f"config field {field} is shared by "
                                    f"{readers}; pinned for all of them: {why}")

    def _attribute_member(self, node: torch.fx.Node, dim: Dim) -> None:
        """Record the attribute ``node`` reads as a member ``(owner, "attr:name")`` of ``dim``."""
        owner, name = node.meta[ATTRIBUTE_META]
        try:
            mod = self.modules(owner)
        except AttributeError:
            mod = None
        owner_name = self.symmap.name_of(mod) if mod is not None and (
            mod in self.symmap) else owner
        key = (owner_name, f"{ATTRIBUTE_PREFIX}{name}")
        self.symbol_dims[key] = dim
        self.param_members.add(key)

    def drop_parameter_member(self, target: str) -> None:
        """The tensor read at ``target`` is sliced by a module's resize rule, not directly."""
        keys = self._member_keys.pop(target, ())
        for key in keys:
            self.param_members.discard(key)
            self.symbol_dims.pop(key, None)
        if keys:  # its module's own symbols produce what it produced
            for producers in self.table.producers.values():
                producers[:] = [p for p in producers if (p[1], p[2]) not in keys]

    def produce_from_parameter(self, dim: Dim, source: torch.fx.Node,
                               node: torch.fx.Node) -> bool:
        """See :meth:`OpContext.produce`: the parameter nearest ``source`` (breadth first
        over its inputs) with a dim in ``dim``'s group becomes a searchable producer of it.

        A tensor of a module with a SymInfo (an ``nn.Linear`` whose weight the model passes to
        ``F.linear`` itself) is skipped: its family's resize rule, not a slice of the tensor,
        keeps that module consistent (``out_features``)."""
        if len(dim) != 1 or dim[0].group is None:
            return False
        root = self.table.find(dim[0].group)
        seen: set[torch.fx.Node] = set()
        queue = [source]
        while queue and len(seen) < 64:
            n = queue.pop(0)
            if n in seen:
                continue
            seen.add(n)
            if n.op == "get_attr" and not self._owned_by_family(str(n.target)):
                for key in self._member_keys.get(str(n.target), ()):
                    segs = self.symbol_dims.get(key, ())
                    g = segs[0].group if len(segs) == 1 else None
                    if g is None or self.table.find(g) != root:
                        continue
                    known = self.table.producers.get(root, [])
                    if not any((q, s) == key for _, q, s, _ in known):
                        self.table.add_producer(g, key[0], key[1], True)
                    return True
            queue.extend(n.all_input_nodes)
        return False

    def _new_parameter(self, node: torch.fx.Node) -> Layout:
        """A parameter or buffer of the model used in the graph: each dim of size > 1 starts a
        group with no producer. If an op ties it to a producer's group, the tensor becomes a
        *parameter member* ``(owner, "name:dim")`` that resize slices along that dim."""
        value = node.meta.get("val")
        owner, _, pname = str(node.target).rpartition(".")
        if not isinstance(value, torch.Tensor) or pname.startswith("_tensor_constant"):
            return fixed_layout(value)
        try:
            mod = self.modules(owner)
        except AttributeError:
            return fixed_layout(value)
        if own_tensor(mod, pname) is None:
            return fixed_layout(value)
        name = (self.symmap.name_of(mod) if mod in self.symmap else owner) if owner else ""
        dims: list[Dim] = []
        for d, size in enumerate(value.shape):
            if size <= 1:
                dims.append(fixed_layout(value)[d])
                continue
            g = self.table.new(size)
            dim = group_dim(g, size)
            key = (name, f"{pname}:{d}")
            self.symbol_dims[key] = dim
            self.param_members.add(key)
            self._member_keys.setdefault(str(node.target), []).append(key)
            dims.append(dim)
        return TensorLayout(dims)

    def boundary(self, node: torch.fx.Node, reason: str) -> Layout:
        """Make every group the node touches constant; its value gets a fixed layout."""
        self.boundaries.add(node)
        self.fix(self._input_layouts(node), reason, node)
        return fixed_layout(node.meta.get("val"))

    def fix(self, layout: Any, reason: str, node: torch.fx.Node | None = None, *,
            sizes_no_tensor: bool = False, kind: str = "boundary") -> bool:
        """Make every group in ``layout`` constant; where that changed one and ``node`` is
        given, a report line of ``kind`` names it. ``sizes_no_tensor``: ``layout`` is a number
        read from a module attribute that the node takes as something other than a tensor size
        (a pooling's ``kernel_size``); a line only about such numbers is a detail of the report
        (:func:`fxsym.analysis.api.analyze`). Returns whether a group changed."""
        changed = False
        dims = [layout] if _is_dim(layout) else list(iter_dims(layout))
        for dim in dims:
            for seg in dim:
                if seg.group is not None:
                    changed |= self.table.fix(seg.group, reason)
        if changed and node is not None:
            where = _where(node)
            self.report.add(kind, where, reason)
            self.pin_sites.extend((seg.group, where, reason) for dim in dims for seg in dim
                                  if seg.group is not None)
            self.number_sites[(where, reason)] = sizes_no_tensor and self.number_sites.get(
                (where, reason), True)
        return changed

    def reword_pin(self, node: torch.fx.Node, g: int, old: str, new: str) -> None:
        """Say ``new`` instead of ``old`` for the pin of ``g``'s group at ``node``: in the group
        table, the report line and the pin sites."""
        self.table.reword(g, old, new)
        where = _where(node)
        self.report.entries = [
            dataclasses.replace(e, message=new)
            if (e.kind, e.where, e.message) == ("boundary", where, old) else e
            for e in self.report.entries]
        self.pin_sites = [(pg, w, new if (w, r) == (where, old) else r)
                          for pg, w, r in self.pin_sites]
        if (where, old) in self.number_sites:
            self.number_sites[(where, new)] = self.number_sites.pop((where, old))

    def explain_fixed_sizes(self) -> None:
        """Name the model input dims that set the fixed sizes groups were pinned at
        (:mod:`.input_sizes`)."""
        meets = [(node, g, size) for node, g, size in self.fixed_meets
                 if self.table.reason(g) == FIXED_DIM]
        if not meets:
            return
        candidates = {(node, g): fixed_candidates(node, size, self.env)
                      for node, g, size in meets}
        found = input_dims(self.gm, [c for cs in candidates.values() for c in cs],
                           self._may_run_fake)
        for (node, g), cs in candidates.items():
            hit = next((c for c in cs if c in found), None)
            if hit is not None:
                self.reword_pin(node, g, FIXED_DIM, describe(*hit, found[hit]))

    def _may_run_fake(self, mod: torch.nn.Module) -> bool:
        """Whether :mod:`.input_sizes` may call (a shadow of) ``mod`` on fake tensors: a
        family with a SymInfo, in eval mode, and no global hook (process-wide, the user's)."""
        if mod not in self.symmap or _global_forward_hooks or _global_forward_pre_hooks:
            return False
        return not any(m.training for m in mod.modules())

    def _owned_by_family(self, target: str) -> bool:
        """Whether the tensor at ``target`` belongs to a module whose family's resize rule
        runs: a module with a SymInfo that the graph calls (itself, or a leaf holding it). A
        family module the model only reads tensors of (``F.linear(x, self.qkv.weight)``) is
        not: its tensor is sliced as a parameter member, and its size attributes follow
        (:func:`.shared.tie_shared_tensors`)."""
        owner = target.rpartition(".")[0]
        try:
            mod = self.model_modules(owner)
        except AttributeError:
            return False
        return mod in self.symmap and id(mod) in self._called

    @functools.cached_property
    def _called(self) -> set[int]:
        """The ids of the modules the graph calls, and of every module inside one."""
        out: set[int] = set()
        for node in self.gm.graph.nodes:
            if node.op == "call_module":
                out.update(id(m) for m in self.gm.get_submodule(str(node.target)).modules())
        return out

    def explain_no_group(self) -> None:
        """Report, for a model left with no searchable group, what pinned its producers (the
        boundaries that reached most of them), or that nothing produces a resizable size."""
        find = self.table.find
        pinned: dict[str, tuple[int, str]] = {}  # reason -> (groups, first place)
        producers = 0
        for root, found in self.table.producers.items():
            if find(root) != root or not any(ok for *_, ok in found):
                continue
            producers += 1
            where, reason = next(((w, r) for g, w, r in self.pin_sites if find(g) == root),
                                 ("", self.table.reasons.get(root, "unknown")))
            count, first = pinned.get(reason, (0, where))
            pinned[reason] = (count + 1, first or where)
        if not producers:
            self.report.add("no-group", "model", (
                "no group: nothing in the graph produces a resizable size (no module with a "
                "SymInfo was called, and no op rule declared a parameter a producer)"))
            return
        top = sorted(pinned.items(), key=lambda kv: -kv[1][0])[:3]
        where = "; ".join(f"{reason!r} ({n}, first at {w or 'the group table'})"
                          for reason, (n, w) in top)
        self.report.add("no-group", "model", (
            f"no group: all {producers} producing groups are constant; pinned by {where}"))

    def _input_layouts(self, node: torch.fx.Node) -> tuple[Layout, ...]:
        return tuple(self.env.get(n) for n in node.all_input_nodes)

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


def _is_dim(obj: Any) -> bool:
    return isinstance(obj, tuple) and bool(obj) and isinstance(obj[0], Seg)


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"module {node.target}"
    target = node.target
    return target if isinstance(target, str) else getattr(target, "__name__", str(target))


def _where(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if node.op == "call_module":
        return f"{node.target} (node {node.name})"
    if stack:
        path = list(stack.values())[-1][0]
        return f"{path} (node {node.name})"
    return f"node {node.name}"


def analyze_graph(gm: torch.fx.GraphModule, symmap: SymMap, report: TraceReport,
                  contract: Contract | None = None, strict_contract: bool = True) -> Analyzer:
    """Run the analyzer; where a rule offered an alternative mapping whose first choice
    ended constant (:meth:`OpContext.offer_alternative`), run it once more with those nodes
    taking their alternative, and keep the run leaving more symbols in searchable groups
    (each run is sound on its own). With ``routing_groups="keep"``
    (:mod:`fxsym.analysis.options`) an offer whose first choice keeps a routed group takes
    its alternative too, and that run is kept. ``report`` receives the kept run's entries."""
    start = list(report.entries)
    analyzer = Analyzer(gm, symmap, report, contract, strict_contract)
    analyzer.run()
    table = analyzer.table
    why: dict[str, str] = {}
    # routing_groups="keep": a split whose first reading keeps a routed group (the experts as
    # routing groups) takes its blocks (expert positions of every routing group) instead
    forced = routing_groups() == "keep" and any(
        s.group is not None and table.find(s.group) in table.routed
        for _, dim in analyzer.offers for s in table.resolve(dim))
    for name, dim in analyzer.offers:
        reasons = [table.reason(s.group) for s in table.resolve(dim) if s.group is not None]
        if reasons and all(reasons):
            why[name] = str(reasons[0])
        elif forced and any(s.group is not None and table.find(s.group) in table.routed
                            for s in table.resolve(dim)):
            why[name] = "routing_groups='keep' keeps the number of routing groups"
    if not why:
        return analyzer
    first = list(report.entries)
    report.entries[:] = start
    second = Analyzer(gm, symmap, report, contract, strict_contract, frozenset(why))
    second.run()
    if forced or _searchable_symbols(second) > _searchable_symbols(analyzer):
        for name, reason in why.items():
            report.add("alternative", f"node {name}", "its alternative mapping is used, since "
                       f"the groups of the first ended constant or are routed ({reason})")
        return second
    report.entries[:] = first
    return analyzer


def _searchable_symbols(an: Analyzer) -> int:
    """How many symbols and members lie (at least in part) in groups that are not constant."""
    table = an.table
    return sum(any(s.group is not None and not table.is_constant(s.group) for s in dim)
               for dim in an.symbol_dims.values())


__all__ = ["Analyzer", "analyze_graph", "resolve_dim"]
