"""Questions Python asked about traced sizes: the guards a trace depends on.

torch.fx records tensor ops; what Python itself computes from a size is answered at trace
time and baked into the graph: ``if y.shape[1] == self.ch:`` took one branch, ``range(C)``
unrolled ``C`` iterations, ``math.sqrt(C)`` became a number. :class:`~fxsym.tracer.ShapeProxy`
records each such answer as a :class:`Guard`: the question (``bool()``, ``int()``,
``float()``, ``an integer index``, ``len()``), the answer, where it was asked, and the
expression it was asked of, written over the sizes it reads:

* :class:`SizeRead` — ``x.shape[d]``, ``x.size(d)``, ``len(x)`` of a tensor node
  (``x.numel()`` is the product of its sizes);
* :class:`AttributeRead` — an int attribute read as a size (``self.ch``,
  ``node.meta[ATTRIBUTE_META]``);
* :class:`Apply` — an operator (``==``, ``%``, ``+``, ...) applied to sub-expressions and
  constants; ``fn is None`` where the value was computed in a way not followed here (its
  reads are kept, its value is unknown); ``fn is tuple`` for a whole shape or a slice of one
  (``x.shape``, ``x.size()``, ``x.shape[:2]``): the tuple of its size reads, so comparing
  shapes as tuples (``if self.shape != x.shape:``) is a question about every size compared.

The expression is plain data captured when the question is asked: the scalar nodes between
the reads and the question are erased from the graph afterwards (they compute nothing the
graph uses). The guard is stored in the ``node.meta[CONCRETE_META]`` list of every node it
reads, which the graph keeps, so the analysis finds each guard once its reads have layouts
and decides it: it holds for every size, it ties what it compares, or it pins.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx

#: ``node.meta`` key of a ``get_attr`` node reading an int attribute of a module the tracer
#: traced into: ``(module qualname, attribute name)``
ATTRIBUTE_META = "fxsym_attribute"
#: ``node.meta`` key: the :class:`Guard` objects that read this node (a tensor whose size, or
#: an attribute whose value, Python asked about at trace time)
CONCRETE_META = "fxsym_concrete"


@dataclass(frozen=True, eq=False)
class SizeRead:
    """``node``'s size along ``dim`` (non-negative) read as an int."""

    node: torch.fx.Node
    dim: int

    def __str__(self) -> str:
        return f"{self.node.name}.shape[{self.dim}]"


@dataclass(frozen=True, eq=False)
class AttributeRead:
    """An int attribute of a module read as a size (a ``get_attr`` node with
    ``ATTRIBUTE_META``)."""

    node: torch.fx.Node

    def __str__(self) -> str:
        owner, name = self.node.meta[ATTRIBUTE_META]
        return f"{owner}.{name}" if owner else f"self.{name}"


@dataclass(frozen=True, eq=False)
class Apply:
    """``fn(*args)``; ``fn is None``: computed from ``args`` in a way not followed."""

    fn: Callable[..., Any] | None
    args: tuple[Any, ...]

    def __str__(self) -> str:
        if self.fn is None:
            return f"a value computed from {', '.join(map(str, self.args))}"
        sym = _SYMBOLS.get(self.fn)
        if sym is not None and len(self.args) == 2:
            return f"({self.args[0]} {sym} {self.args[1]})"
        if sym is not None and len(self.args) == 1:
            return f"{sym}{self.args[0]}"
        name = getattr(self.fn, "__name__", str(self.fn))
        return f"{name}({', '.join(map(str, self.args))})"


Expr = Any  # SizeRead | AttributeRead | Apply | a Python constant

_SYMBOLS: dict[Any, str] = {
    operator.eq: "==", operator.ne: "!=", operator.lt: "<", operator.le: "<=",
    operator.gt: ">", operator.ge: ">=", operator.add: "+", operator.sub: "-",
    operator.mul: "*", operator.floordiv: "//", operator.truediv: "/", operator.mod: "%",
    operator.pow: "**", operator.and_: "&", operator.or_: "|", operator.neg: "-",
    operator.not_: "not ",
}


@dataclass(frozen=True, eq=False)
class Guard:
    """Python asked ``question`` of ``expr`` at trace time and got ``answer``, in the forward
    of module ``where`` (``""``: the root), at node ``node`` (the node asked)."""

    expr: Expr
    question: str
    answer: Any
    where: str
    node: str

    def reads(self) -> Iterator[SizeRead | AttributeRead]:
        """The size and attribute reads of the expression."""
        todo = [self.expr]
        while todo:
            e = todo.pop()
            if isinstance(e, (SizeRead, AttributeRead)):
                yield e
            elif isinstance(e, Apply):
                todo.extend(e.args)

    def __str__(self) -> str:
        return f"{self.question} of {self.expr} (answered {self.answer!r})"


def record_guard(node: torch.fx.Node, question: str, answer: Any, where: str) -> Guard | None:
    """Record that Python asked ``question`` of ``node``'s value and got ``answer``: the
    :class:`Guard` is appended to ``node.meta[CONCRETE_META]`` of every node it reads.
    ``None`` (nothing recorded) where the value reads no size."""
    guard = Guard(_expr(node, {}), question, answer, where, node.name)
    reads = list(guard.reads())
    if not reads:
        return None
    for read in reads:
        guards = read.node.meta.setdefault(CONCRETE_META, [])
        if guard not in guards:
            guards.append(guard)
    return guard


def drop_index_questions(asked: list[torch.fx.Node], node: torch.fx.Node) -> None:
    """Forget the ``an integer index`` guards asked of the values in ``asked`` that ``node``,
    the next node recorded, takes as arguments, and empty ``asked``.

    torch's argument parser asks ``__index__`` of every value passed where an int is expected
    (``F.conv1d(x, w, groups=c)``) before ``__torch_function__`` records the call with the
    value itself as an argument: the graph keeps following the size, and the op's rule decides
    what it means. Nothing runs between that question and the call's node, so a question asked
    since the last node of a value the new node takes is the parser's."""
    if not asked:
        return
    taken = set(node.all_input_nodes)
    for value in asked:
        if value not in taken:
            continue
        for guards in _guard_lists(value):
            guards[:] = [g for g in guards
                         if not (g.node == value.name and g.question == "an integer index")]
    asked.clear()


def _guard_lists(value: torch.fx.Node) -> Iterator[list[Guard]]:
    """The guard lists of the nodes ``value``'s expression reads."""
    for read in _reads_of((_expr(value, {}),)):
        guards = read.node.meta.get(CONCRETE_META)
        if guards is not None:
            yield guards


def record_size_guard(node: torch.fx.Node, dim: int, question: str, answer: Any,
                      where: str) -> Guard:
    """Record a question asked of a tensor node's size along ``dim`` (``len(x)``)."""
    guard = Guard(SizeRead(node, dim), question, answer, where, node.name)
    node.meta.setdefault(CONCRETE_META, []).append(guard)
    return guard


def _expr(node: torch.fx.Node, memo: dict[torch.fx.Node, Expr]) -> Expr:
    """The expression of the scalar ``node`` over size and attribute reads."""
    if node in memo:
        return memo[node]
    memo[node] = Apply(None, ())  # a cycle cannot happen; this only stops runaway recursion
    found: Expr = _read(node)
    shape = _shape_of(node) if found is None else None
    if shape is not None:  # a whole shape, or a slice of one: the tuple of its sizes
        found = Apply(tuple, tuple(SizeRead(shape[0], d) for d in shape[1]))
    elif found is None:
        target = node.target
        fn = target if node.op == "call_function" and target in _FOLLOWED else None
        args = tuple(_expr(a, memo) if isinstance(a, torch.fx.Node) and _scalar(a) else
                     (a if not isinstance(a, torch.fx.Node) else _opaque(a, memo))
                     for a in node.args)
        if fn is None or node.kwargs:
            found = Apply(None, tuple(_reads_of(args)))
        else:
            found = Apply(fn, args)  # type: ignore[arg-type]
    memo[node] = found
    return found


def _opaque(node: torch.fx.Node, memo: dict[torch.fx.Node, Expr]) -> Expr:
    """A non-scalar argument (a tensor, a ``torch.Size``): its reads, value unknown."""
    if isinstance(node.meta.get("val"), torch.Tensor):
        return Apply(None, ())
    return _expr(node, memo)


def _reads_of(args: Any) -> Iterator[SizeRead | AttributeRead]:
    for a in args:
        if isinstance(a, (SizeRead, AttributeRead)):
            yield a
        elif isinstance(a, Apply):
            yield from _reads_of(a.args)


_FOLLOWED = frozenset(_SYMBOLS)


def _scalar(node: torch.fx.Node) -> bool:
    return type(node.meta.get("val")) in (int, float, bool)


def _read(node: torch.fx.Node) -> Expr | None:
    """``node`` as a read of one size (``x.numel()``: the product of its sizes), if it is
    one."""
    if ATTRIBUTE_META in node.meta:
        return AttributeRead(node)
    if node.op == "call_method" and node.target == "numel" and len(node.args) == 1:
        src = node.args[0]
        val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if isinstance(src, torch.fx.Node) and isinstance(val, torch.Tensor):  # every size
            reads: list[Expr] = [SizeRead(src, d) for d in range(val.dim())]
            product = reads[0] if reads else 1
            for read in reads[1:]:
                product = Apply(operator.mul, (product, read))
            return product
        return None
    if node.op == "call_method" and node.target == "size":
        d = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim")
        src = node.args[0]
        if type(d) is int and isinstance(src, torch.fx.Node):
            return _size_read(src, d)
        return None
    if node.op == "call_function" and node.target is operator.getitem and type(
            node.args[1]) is int and isinstance(node.args[0], torch.fx.Node):
        found = _shape_of(node.args[0])
        if found is not None:
            src, dims = found
            i = node.args[1]
            if -len(dims) <= i < len(dims):
                return SizeRead(src, dims[i])
    return None


def _size_read(src: torch.fx.Node, d: int) -> SizeRead | None:
    val = src.meta.get("val")
    if not isinstance(val, torch.Tensor) or not -val.dim() <= d < val.dim():
        return None
    return SizeRead(src, d % val.dim())


def _shape_of(node: torch.fx.Node) -> tuple[torch.fx.Node, list[int]] | None:
    """``(tensor node, dims)`` for a node whose value is (a slice of) a tensor's shape:
    ``x.shape``, ``x.size()``, ``x.shape[2:]``."""
    if not isinstance(node.meta.get("val"), torch.Size):
        return None
    src: Any = None
    if node.op == "call_function" and node.target is getattr and node.args[1] == "shape":
        src = node.args[0]
    elif node.op == "call_method" and node.target == "size" and len(node.args) == 1:
        src = node.args[0]
    elif node.op == "call_function" and node.target is operator.getitem and isinstance(
            node.args[1], slice) and isinstance(node.args[0], torch.fx.Node):
        found = _shape_of(node.args[0])
        if found is None:
            return None
        return found[0], found[1][node.args[1]]
    if not isinstance(src, torch.fx.Node) or not isinstance(src.meta.get("val"), torch.Tensor):
        return None
    return src, list(range(src.meta["val"].dim()))


__all__ = ["ATTRIBUTE_META", "CONCRETE_META", "Apply", "AttributeRead", "Guard", "SizeRead",
           "drop_index_questions", "record_guard", "record_size_guard"]
