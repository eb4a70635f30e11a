"""Depth as a group: which stacks of blocks are residual, proven on the traced graph.

A ``ModuleList`` (or ``Sequential``) of at least two blocks, holding no module or parameter
in common, is a :class:`~fxsym.symbols.DepthGroup` when the graph shows, for every block ``i`` (its
nodes: those whose ``nn_module_stack`` holds the block):

* **in sequence**: the blocks' nodes come one block after the other, and block ``i``'s
  *stream input* is block ``i - 1``'s output, read by no node outside block ``i`` (so no
  other block, and no output of the model, sees it);
* **one output**: exactly one node of the block is read outside it, a tensor;
* **residual**: that output is the stream input plus terms computed in the block, a chain
  of additions (``s + a``, ``(s + a) + b``, either operand order) each of the stream's shape
  and dtype, so that removing the block is replacing it by the identity;
* **the same group**: the stream input and the output have the same groups dim by dim (the
  width groups stay valid whichever blocks are kept);
* **nothing else shared**: a block reads no value computed inside another block besides its
  stream input, and its forward reads no attribute that counts the blocks (``layer_idx``:
  renumbered after a drop, it would change what the block computes).

The first block's stream input is the value outside it that starts its chain. Values other
than the stream that the blocks read (masks, position embeddings) may differ from block to
block; they are recorded (``DepthGroup.varying_inputs``): which block reads which is chosen
by position, so a resize needs a plugin to make that choice follow the kept blocks.

The blocks may be of several classes (a hybrid stack: Jamba's attention and Mamba layers):
each is proven residual on its own, and what chooses each position's class is the plugins'
to renumber (``fxsym_after_depth``). Each such block's parameters must all be read by the
graph: a block holding parts it does not run (Zamba2's adapters of the other hybrid
positions) has them chosen by something else than itself.

A ``ModuleList`` that fails one condition gets a ``depth`` line in the trace report saying
which and where (a ``Sequential`` of blocks of one class, or a ``ModuleList`` of several: a
detail line, shown with ``verbose``: most are a conv, a norm and an activation, blocks ending
in an activation after their sum, or a list of unlike stages); a list whose blocks the graph
never calls, and a ``Sequential`` of several classes (a network's body), are silent.

Imports from fxsym: symbols, tracer.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch import fx, nn

from ..symbols import DepthGroup, GroupIndex
from ..tracer.questions import ATTRIBUTE_META
from ..tracer.report import TraceReport
from .layout import TensorLayout

__all__ = ["SUFFIX", "find_depth_groups"]

#: a depth group's name is its container's qualified name followed by this
SUFFIX = ".depth"

_ADDS = {operator.add, operator.iadd, torch.add, torch.Tensor.add}


class _NotResidual(Exception):
    """Why a stack is not a depth group."""


def find_depth_groups(model: nn.Module, graph: fx.Graph, layouts: Mapping[str, Any],
                      table: GroupIndex, report: TraceReport,
                      groups: Mapping[int, str] | None = None) -> tuple[DepthGroup, ...]:
    """The depth groups of ``model`` as traced in ``graph`` (``layouts``: the analysis' node
    layouts; ``table``: its group table; ``groups``: the searchable groups' names by root);
    a ``depth`` report line for each stack refused."""
    nodes = list(graph.nodes)
    order = {n: i for i, n in enumerate(nodes)}
    inside: dict[str, list[fx.Node]] = {}
    for n in nodes:
        for key, value in (n.meta.get("nn_module_stack") or {}).items():
            path = value[0] if isinstance(value, tuple) else key
            inside.setdefault(path, []).append(n)
    found: list[DepthGroup] = []
    read: set[str] | None = None  # what the graph reads: modules called, attributes
    for qualname, container in model.named_modules():
        children = list(container.named_children())
        if not isinstance(container, (nn.ModuleList, nn.Sequential)) or len(children) < 2:
            continue
        names = [f"{qualname}.{k}" if qualname else k for k, _ in children]
        members = [list(dict.fromkeys(inside.get(name, ()))) for name in names]
        if not any(members):
            continue
        try:
            _not_shared(names, [c for _, c in children])  # else its weights' reads tell less
            if len({type(c) for _, c in children}) > 1:
                if read is None:
                    read = {str(n.target) for n in nodes if n.op in ("call_module", "get_attr")}
                _all_read(names, [c for _, c in children], read)
            found.append(_prove(container, qualname, names, members, order, layouts, table,
                                groups or {}))
        except _NotResidual as exc:
            alike = len({type(c) for _, c in children}) == 1
            listed = isinstance(container, nn.ModuleList)
            if alike or listed:  # a Sequential of unlike layers is a network's body: silent
                report.add("depth", qualname or "<root>", f"no depth group: {exc}",
                           detail=not (listed and alike))
    return tuple(found)


def _all_read(names: list[str], blocks: list[nn.Module], read: set[str]) -> None:
    """Refuse blocks of a stack of several classes holding a parameter the traced forward
    never reads (Zamba2's hybrid layers hold an adapter for each hybrid position and run the
    one their position picks): which of its parts a block runs is then chosen by something
    else than the block, which would not follow a renumbering."""
    for name, block in zip(names, blocks, strict=True):
        for pname, _ in block.named_parameters():
            parts = f"{name}.{pname}".split(".")
            if not any(".".join(parts[:i]) in read for i in range(1, len(parts) + 1)):
                raise _NotResidual(f"block {name} holds {pname}, which the traced forward "
                                   "never reads: which of its parts a block runs is chosen "
                                   "elsewhere (by its position?) and would not follow a "
                                   "renumbering")


def _not_shared(names: list[str], blocks: list[nn.Module]) -> None:
    """Refuse blocks holding a module or a parameter in common (Zamba2's transformer shared
    by its hybrid blocks, with adapters and cache slots chosen by position): what the shared
    part holds for each block is not the block's own, and no renumbering of the blocks
    reaches it."""
    owner: dict[int, tuple[str, str]] = {}
    for name, block in zip(names, blocks, strict=True):
        held = [(path, "module", mod) for path, mod in block.named_modules(
            remove_duplicate=False)]
        held += [(path, "parameter", p) for path, p in block.named_parameters(
            remove_duplicate=False)]
        for path, what, obj in held:
            other = owner.setdefault(id(obj), (name, path))
            if other[0] != name:
                raise _NotResidual(f"blocks {other[0]} and {name} share the {what} "
                                   f"{path or '(the block)'}: what the shared part holds "
                                   "for each block would not follow a renumbering")


def _prove(container: nn.Module, qualname: str, names: list[str],
           members: list[list[fx.Node]], order: Mapping[fx.Node, int],
           layouts: Mapping[str, Any], table: GroupIndex, groups: Mapping[int, str]
           ) -> DepthGroup:
    for name, inside in zip(names, members, strict=True):
        if not inside:
            raise _NotResidual(f"block {name} is not called by the traced forward")
    for before, after, name in zip(members, members[1:], names[1:], strict=False):
        if max(order[n] for n in before) > min(order[n] for n in after):
            raise _NotResidual(f"block {name} runs before the previous block ends: the blocks "
                               "are not applied one after the other")
    block_of = {n: i for i, inside in enumerate(members) for n in inside}
    # found when first needed: a scan of every attribute of every block, and most stacks
    # are refused before
    positions: set[tuple[str, str]] | None = None
    streams: list[fx.Node] = []
    outputs: list[fx.Node] = []
    reads: list[list[fx.Node]] = []
    for i, (name, inside) in enumerate(zip(names, members, strict=True)):
        mine = set(inside)
        out = [n for n in inside if any(u not in mine for u in n.users)]
        if len(out) != 1 or not isinstance(out[0].meta.get("val"), torch.Tensor):
            shown = ", ".join(n.name for n in out) or "nothing"
            raise _NotResidual(f"block {name} passes on {shown}, not one tensor (its output)")
        external = list(dict.fromkeys(
            a for n in inside for a in n.all_input_nodes if a not in mine))
        for a in external:
            j = block_of.get(a)
            if j is not None and not (j == i - 1 and a is outputs[-1]):
                raise _NotResidual(f"block {name} reads {a.name} of block {names[j]}, not "
                                   "only the previous block's output")
        for n in inside:
            where = n.meta.get(ATTRIBUTE_META)
            if where is None or _relative(where[0], name) is None:
                continue
            if positions is None:
                positions = _positions(container)
            if (_relative(where[0], name), where[1]) in positions:
                raise _NotResidual(f"the forward of block {name} reads {where[0]}.{where[1]}, "
                                   "which counts the blocks: renumbered, the block would "
                                   "compute something else")
        if i:
            if outputs[-1] not in external:
                raise _NotResidual(f"block {name} does not read the previous block's output")
            stream = outputs[-1]
            if not _chain(out[0], stream, mine):
                raise _NotResidual(f"block {name} is not residual: its output is not its "
                                   f"input {stream.name} plus terms it computes")
        else:
            starts = [a for a in external if _chain(out[0], a, mine)]
            if len(starts) != 1:
                raise _NotResidual(f"block {name} is not residual: its output is not one of "
                                   "its inputs plus terms it computes")
            stream = starts[0]
        _same_stream(name, stream, out[0], layouts, table)
        others = [u.name for u in stream.users if u not in mine]
        if i and others:
            raise _NotResidual(f"the output of block {names[i - 1]} is read outside block "
                               f"{name} too ({', '.join(others)})")
        streams.append(stream)
        outputs.append(out[0])
        reads.append([a for a in external if a is not stream and a.op != "get_attr"])
    feature_dim = _feature_dim(streams[0], layouts, table)
    if positions is None:
        positions = _positions(container)
    return DepthGroup(name=qualname + SUFFIX, container=qualname, size=len(names),
                      blocks=tuple(names), positions=tuple(sorted(positions)),
                      feature_dim=feature_dim, varying_inputs=_varying(names, reads),
                      stream_group=_group_at(streams[0], feature_dim, layouts, table, groups))


def _relative(path: str, block: str) -> str | None:
    if path == block:
        return ""
    return path[len(block) + 1:] if path.startswith(block + ".") else None


def _is_add(n: fx.Node) -> bool:
    if n.op == "call_function" and n.target in _ADDS:
        return "alpha" not in n.kwargs and len(n.args) == 2
    return n.op == "call_method" and n.target in ("add", "add_", "__add__", "__iadd__") and (
        "alpha" not in n.kwargs and len(n.args) == 2)


def _chain(out: fx.Node, stream: fx.Node, inside: set[fx.Node]) -> bool:
    """Whether ``out`` is ``stream`` plus terms computed inside the block, by a chain of
    additions each keeping ``stream``'s shape and dtype."""
    ref = stream.meta.get("val")
    if not isinstance(ref, torch.Tensor):
        return False
    cur = out
    while cur is not stream:
        val = cur.meta.get("val")
        if cur not in inside or not _is_add(cur) or not isinstance(val, torch.Tensor) or (
                val.shape != ref.shape or val.dtype != ref.dtype):
            return False
        sides = [a for a in cur.args if isinstance(a, fx.Node) and _reaches(a, stream, inside)]
        on_chain = [a for a in sides if a is stream or _is_add(a)]
        if len(sides) != 1 or len(on_chain) != 1:
            return False
        cur = on_chain[0]
    return True


def _reaches(node: fx.Node, stream: fx.Node, inside: set[fx.Node]) -> bool:
    """Whether ``node`` is ``stream`` or an addition of the block with ``stream`` as a
    direct or chained operand (the other operand, a term, may read the stream anyhow)."""
    cur: Any = node
    while isinstance(cur, fx.Node):
        if cur is stream:
            return True
        if cur not in inside or not _is_add(cur):
            return False
        nxt = [a for a in cur.args if isinstance(a, fx.Node) and (a is stream or _is_add(a))]
        if len(nxt) != 1:
            return any(a is stream for a in nxt)
        cur = nxt[0]
    return False


def _key(layout: Any, table: GroupIndex) -> Any:
    if not isinstance(layout, TensorLayout):
        return None
    return tuple(tuple((None if s.group is None else table.find(s.group), s.units, s.block)
                       for s in dim) for dim in layout)


def _same_stream(name: str, stream: fx.Node, out: fx.Node, layouts: Mapping[str, Any],
                 table: GroupIndex) -> None:
    a, b = _key(layouts.get(stream.name), table), _key(layouts.get(out.name), table)
    if a is None or a != b:
        raise _NotResidual(f"block {name}: the groups of its output are not those of its "
                           f"input {stream.name}")


def _group_at(stream: fx.Node, dim: int, layouts: Mapping[str, Any], table: GroupIndex,
              groups: Mapping[int, str]) -> str | None:
    """The searchable group that is the whole of ``stream``'s dim ``dim``, if one is."""
    key = _key(layouts.get(stream.name), table)
    if not key:
        return None
    segs = key[dim]
    return groups.get(segs[0][0]) if len(segs) == 1 and segs[0][0] is not None else None


def _feature_dim(stream: fx.Node, layouts: Mapping[str, Any], table: GroupIndex) -> int:
    """The last dim of the stream holding a group (its features), else the last dim."""
    key = _key(layouts.get(stream.name), table)
    if key:
        for d in range(len(key) - 1, -1, -1):
            if any(g is not None for g, _, _ in key[d]):
                return d - len(key)
    return -1


def _positions(container: nn.Module) -> set[tuple[str, str]]:
    """``(path inside a block, name)`` of the int attributes that hold their block's position:
    an attribute name each of whose occurrences, in whichever blocks hold one and at
    whatever path, holds that block's position, in at least two blocks (a hybrid stack's
    ``layer_idx`` sits in the attention of some blocks and in the mixer of the others)."""
    found: dict[str, set[tuple[str, str]]] = {}
    blocks: dict[str, set[int]] = {}
    wrong: set[str] = set()
    for i, block in enumerate(container.children()):
        for path, mod in block.named_modules():
            for name, value in vars(mod).items():
                if type(value) is not int or name.startswith("_") or name in wrong:
                    continue
                if value != i:
                    wrong.add(name)
                    continue
                found.setdefault(name, set()).add((path, name))
                blocks.setdefault(name, set()).add(i)
    return {key for name, keys in found.items()
            if name not in wrong and len(blocks[name]) >= 2 for key in keys}


def _varying(names: list[str], reads: list[list[fx.Node]]) -> tuple[str, ...]:
    first = reads[0]
    out = []
    for name, mine in zip(names[1:], reads[1:], strict=True):
        if mine != first:
            a = ", ".join(n.name for n in first)
            b = ", ".join(n.name for n in mine)
            out.append(f"{names[0]} reads {a}; {name} reads {b}")
    return tuple(out)
