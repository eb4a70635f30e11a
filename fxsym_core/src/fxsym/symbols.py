"""Symbols: the resizable (or fixed) sizes of one module, and the map of them over a model.

A :class:`Symbol` is one size of one module, e.g. ``out_channels`` of a conv. It is in exactly
one of four states:

* *free*: nothing decided yet (the state before analysis);
* *searchable*: the root of a cross-layer group, its value may be chosen;
* *dynamic*: linked to a parent symbol whose value it follows;
* *constant*: its value cannot change.

Cross-layer symbols say which dimension of the module's input (``INCOMING``) or output
(``OUTGOING``) tensor they size, through ``elastic_dims`` (several equivalent spellings of one
dimension, e.g. ``{1, -3}`` for the channels of NCHW).

A :class:`SymInfo` holds the symbols of one module, and may declare which of the module's int
attributes derive from them (:class:`SizeExpr`: ``num_heads = heads``). A :class:`SymMap` holds
the SymInfos of a model's modules and, after :func:`fxsym.analyze`, what the analysis found (a
:class:`GroupAnalysis`), whose searchable groups it offers as :class:`SymGroup`.

This module names no higher room but for :attr:`SymMap.trace_report` (an empty
``TraceReport`` until :func:`fxsym.analyze` sets one; plain data): what it needs of the
analysis' dimension segments and group table is spelled as the protocols :class:`Segment` and
:class:`GroupIndex`.

Imports from fxsym: nothing (the registry and the tracer's ``TraceReport`` inside functions).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any, Protocol

from torch import fx, nn

if TYPE_CHECKING:
    from .registry import Registry
    from .tracer.report import TraceReport

__all__ = [
    "DepthGroup",
    "GroupAnalysis",
    "GroupIndex",
    "Segment",
    "SizeExpr",
    "SymGroup",
    "SymInfo",
    "SymMap",
    "Symbol",
    "SymbolKey",
    "attribute_value",
    "combine_step",
    "set_attribute",
]


class Symbol:
    """One size of one module; see the module docstring for its states."""

    class CLType(Enum):
        """How a symbol relates to the tensors crossing the module boundary."""

        NONE = "none"
        INCOMING = "incoming"
        OUTGOING = "outgoing"

    def __init__(
        self,
        is_searchable: bool = False,
        is_sortable: bool = True,
        cl_type: Symbol.CLType = CLType.NONE,
        elastic_dims: Iterable[int] | None = None,
        *,
        units: int | None = None,
        units_stay: bool = False,
        size: int | None = None,
        block: int = 1,
        covers: Iterable[tuple[str, str]] = (),
        copies: int = 1,
        places: Iterable[tuple[str, tuple[int | str, ...]]] = (),
    ) -> None:
        #: an INCOMING symbol's dim may only change in this many whole pieces (conv groups)
        self.units = units
        #: with ``units``: the pieces stay instead, and each loses as many entries as every
        #: other, at the same places (a group norm that keeps its ``num_groups``)
        self.units_stay = units_stay
        #: the size of a searchable symbol that is not cross-layer (heads inside a leaf)
        self.size = size
        #: entries per unit of an OUTGOING symbol (a head of ``head_dim`` features)
        self.block = block
        #: ``(submodule path relative to this module, symbol name)`` of the symbols inside a
        #: leaf that this symbol sizes (an attention leaf's ``heads`` size its ``q_proj``'s
        #: ``out_features``): they join this symbol's groups as members, and this module's
        #: resize rule, not theirs, resizes them
        self.covers: tuple[tuple[str, str], ...] = tuple(covers)
        #: an OUTGOING symbol's dim holds this many consecutive copies of its group, the
        #: same entries kept in each (a bidirectional RNN's forward then backward half)
        self.copies = copies
        #: further tensor dims this symbol sizes, one copy each: ``("input", path)`` or
        #: ``("output", path)``, ``path`` indexing the module's arguments (a position, or a
        #: keyword's name) or its output down to a tensor, then the dim
        #: (``("output", (1, 0, -1))``: the last dim of ``output[1][0]``, an LSTM's ``h_n``);
        #: an input dim is tied to the symbol's group, an output dim carries it (places a call
        #: does not have are skipped)
        self.places: tuple[tuple[str, tuple[int | str, ...]], ...] = tuple(places)
        self._is_searchable = is_searchable
        self._is_sortable = is_sortable
        self._is_constant = False
        self._cl_type = cl_type
        self._elastic_dims: set[int] = set(elastic_dims or ())
        self._parent: Symbol | None = None
        self._dependencies: list[Symbol] = []
        if self.is_cross_layer != bool(self._elastic_dims):
            raise ValueError(
                "a cross-layer symbol (INCOMING/OUTGOING) needs elastic_dims, "
                "and only cross-layer symbols may have them"
            )

    # -- states -----------------------------------------------------------------------------
    @property
    def parent(self) -> Symbol | None:
        """The symbol this one follows, if it is dynamic."""
        return self._parent

    @property
    def dependencies(self) -> list[Symbol]:
        """The symbols that follow this one."""
        return self._dependencies

    @property
    def is_searchable(self) -> bool:
        return self._is_searchable

    @property
    def is_dynamic(self) -> bool:
        return self._parent is not None

    @property
    def is_constant(self) -> bool:
        return self._is_constant

    @property
    def is_free(self) -> bool:
        return not (self._is_searchable or self._is_constant or self._parent is not None)

    @property
    def is_sortable(self) -> bool:
        """Whether every symbol of this symbol's dependency tree may be reordered."""
        return all(s._is_sortable for s in self._tree())

    @is_sortable.setter
    def is_sortable(self, value: bool) -> None:
        self._is_sortable = value

    @property
    def is_sortable_itself(self) -> bool:
        """Whether this symbol alone may be reordered, whatever the symbols linked to it say
        (the value ``is_sortable`` was last set to)."""
        return self._is_sortable

    # -- cross-layer properties -------------------------------------------------------------
    @property
    def cl_type(self) -> Symbol.CLType:
        return self._cl_type

    @property
    def is_cross_layer(self) -> bool:
        return self._cl_type is not Symbol.CLType.NONE

    @property
    def is_incoming(self) -> bool:
        return self._cl_type is Symbol.CLType.INCOMING

    @property
    def is_outgoing(self) -> bool:
        return self._cl_type is Symbol.CLType.OUTGOING

    @property
    def is_dangling(self) -> bool:
        """Cross-layer and still free: analysis has not decided it."""
        return self.is_cross_layer and self.is_free

    @property
    def elastic_dims(self) -> set[int]:
        """Equivalent indices of the one input/output tensor dimension this symbol sizes."""
        return self._elastic_dims

    # -- transitions ------------------------------------------------------------------------
    def link_to(self, parent: Symbol) -> None:
        """Make this symbol follow ``parent`` (it becomes dynamic)."""
        if parent is self:
            raise ValueError("a symbol cannot follow itself")
        if not (self.is_free or self._is_searchable):
            raise ValueError(f"only a free or searchable symbol can be linked, not {self!r}")
        if parent.is_constant:
            raise ValueError("cannot link to a constant symbol; disable() this one instead")
        if (self._parent is not None or self._dependencies) and self in parent._tree():
            # (a symbol linked to nothing and followed by nothing is in no other's tree)
            raise ValueError("linking would create a cycle")
        self._is_searchable = False
        self._parent = parent
        parent._dependencies.append(self)

    def make_searchable(self) -> None:
        """Make this symbol the searchable root of its group (its value may be chosen).

        Raises ``ValueError`` if it is constant or dynamic: such a symbol cannot lead a group.
        """
        if self._is_constant or self._parent is not None:
            raise ValueError(f"only a free or searchable symbol can be made searchable, not "
                             f"{self!r}")
        self._is_searchable = True

    def disable(self) -> None:
        """Make this symbol and its whole dependency tree (parents and followers) constant."""
        for sym in self._tree():
            sym._parent = None
            sym._dependencies = []
            sym._is_searchable = False
            sym._is_sortable = False
            sym._is_constant = True

    def _tree(self) -> list[Symbol]:
        seen: dict[int, Symbol] = {}
        stack = [self]
        while stack:
            sym = stack.pop()
            if id(sym) in seen:
                continue
            seen[id(sym)] = sym
            stack.extend(sym._dependencies)
            if sym._parent is not None:
                stack.append(sym._parent)
        return list(seen.values())

    def __repr__(self) -> str:
        flags = ("searchable", "free", "dynamic", "constant", "incoming", "outgoing")
        shown = [f for f in flags if getattr(self, f"is_{f}")]
        return f"Symbol({', '.join(shown)})"


#: the prefix of an attribute member's symbol name: ``(owner, "attr:num_heads")``
ATTRIBUTE_PREFIX = "attr:"

_TOKEN = re.compile(r"\s*(?:(//)|(\*)|([A-Za-z_][A-Za-z0-9_]*)|([0-9]+))")


@dataclass(frozen=True)
class SizeExpr:
    """How an int attribute of a module derives from the module's symbols: a product of
    factors, optionally floor-divided by one more.

    Each factor and the divisor is a symbol name of the module's SymInfo or a positive int
    constant; at least one factor is a symbol. A symbol stands for its *size in its own
    units*: the number of entries of the tensor dimension it sizes divided by its
    :attr:`Symbol.block` (for a symbol that is not cross-layer: :attr:`Symbol.size`). Written
    as text, ``"heads"``, ``"heads * head_dim"``, ``"hidden // heads"``, ``"embed_dim // 8"``
    (:meth:`parse`); nothing else (no sums, no parentheses, one division at the end).

    :func:`fxsym.resize` refuses a choice for which the division leaves a remainder or the
    value drops below 1 (the module's sizes would disagree), and a module whose attribute does
    not equal its expression before the resize (the declaration does not describe it).
    """

    factors: tuple[str | int, ...]
    divisor: str | int | None = None

    def __post_init__(self) -> None:
        terms = [*self.factors, *([] if self.divisor is None else [self.divisor])]
        for t in terms:
            if isinstance(t, bool) or not (
                    (isinstance(t, int) and t >= 1) or (isinstance(t, str) and t.isidentifier())):
                raise ValueError(f"size expression {self}: {t!r} is neither a symbol name nor "
                                 "a positive int")
        if not any(isinstance(f, str) for f in self.factors):
            raise ValueError(f"size expression {self}: no symbol among the factors (a "
                             "constant attribute needs no declaration)")

    @classmethod
    def parse(cls, text: str) -> SizeExpr:
        """``"a * b // c"`` as a SizeExpr; ``ValueError`` naming what is wrong otherwise."""
        tokens: list[str | int] = []
        pos = 0
        text = text.strip()
        while pos < len(text):
            m = _TOKEN.match(text, pos)
            if m is None or m.end() == pos:
                raise ValueError(f"size expression {text!r}: unexpected {text[pos:]!r}; write a "
                                 "product of symbol names and ints, optionally '// divisor'")
            div, mul, name, num = m.groups()
            tokens.append(div or mul or name or int(num))
            pos = m.end()
        terms, ops = tokens[0::2], tokens[1::2]
        if (not tokens or len(tokens) % 2 == 0 or any(t not in ("*", "//") for t in ops)
                or any(t in ("*", "//") for t in terms)):
            raise ValueError(f"size expression {text!r}: expected 'term (* term)* (// term)?', "
                             "each term a symbol name or an int")
        if "//" in ops[:-1]:
            raise ValueError(f"size expression {text!r}: '//' may only come last")
        divisor = terms.pop() if ops and ops[-1] == "//" else None
        return cls(tuple(terms), divisor)

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbol names the expression reads, in order, each once."""
        terms = [*self.factors, *([] if self.divisor is None else [self.divisor])]
        return tuple(dict.fromkeys(t for t in terms if isinstance(t, str)))

    def evaluate(self, values: Mapping[str, int]) -> tuple[int, int]:
        """``(value, remainder)`` of the expression, each symbol taking ``values[name]``."""
        product = 1
        for f in self.factors:
            product *= values[f] if isinstance(f, str) else f
        if self.divisor is None:
            return product, 0
        d = values[self.divisor] if isinstance(self.divisor, str) else self.divisor
        if d <= 0:
            return 0, product
        return product // d, product % d

    def __str__(self) -> str:
        text = " * ".join(str(f) for f in self.factors)
        return text if self.divisor is None else f"{text} // {self.divisor}"


class SymInfo:
    """The symbols of one module, and the int attributes that derive from them.

    ``is_shape_preserving`` says the module's output has the shape and dimension layout of its
    first input (a norm, an activation), so groups pass through it unchanged.
    ``leading_dims_are_batch`` says the module treats every input dim before its last as a
    batch dim (a Linear: ``[B, C, N]`` mixes the ``N`` entries of each ``(b, c)`` alone), so
    those dims pass to the output unchanged (the channels of an MLP-Mixer's token MLP).

    :attr:`attributes` maps names of the module's own int attributes to the
    :class:`SizeExpr` they equal (see :meth:`declare`): :func:`fxsym.resize` sets them after
    each resize rule call on the module, and each is a member ``(module, "attr:name")`` of the
    groups of the symbols it reads.
    """

    def __init__(self, is_shape_preserving: bool = False, leading_dims_are_batch: bool = False,
                 **symbols: Symbol) -> None:
        self._is_shape_preserving = is_shape_preserving
        self._leading_dims_are_batch = leading_dims_are_batch
        self.symbols: dict[str, Symbol] = dict(symbols)
        #: module attribute name -> the expression over this SymInfo's symbols it equals
        self.attributes: dict[str, SizeExpr] = {}

    def declare(self, **attributes: str | SizeExpr) -> SymInfo:
        """Declare module attributes derived from this SymInfo's symbols and return ``self``:
        ``SymInfo(...).declare(num_heads="heads", head_dim="hidden // heads")``.

        Each value is a :class:`SizeExpr` or its text (:meth:`SizeExpr.parse`). Raises
        ``ValueError`` if an expression does not parse, reads a symbol this SymInfo does not
        have, or the attribute name is private (``_x``) or not an identifier. The attribute
        must hold an int on the module when a resize changes one of its symbols.
        """
        for name, expr in attributes.items():
            if not name.isidentifier() or name.startswith("_"):
                raise ValueError(f"declared attribute {name!r}: not a public attribute name")
            parsed = SizeExpr.parse(expr) if isinstance(expr, str) else expr
            if not isinstance(parsed, SizeExpr):
                raise ValueError(f"declared attribute {name!r}: expected a SizeExpr or its "
                                 f"text, got {expr!r}")
            missing = [s for s in parsed.symbols if s not in self.symbols]
            if missing:
                raise ValueError(f"declared attribute {name} = {parsed}: no symbol "
                                 f"{', '.join(map(repr, missing))} in this SymInfo (symbols: "
                                 f"{', '.join(self.symbols) or 'none'})")
            self.attributes[name] = parsed
        return self

    def sizes(self, entries: Mapping[str, int]) -> dict[str, int]:
        """Each symbol's size in its own units, as a :class:`SizeExpr` reads it: ``entries``
        (the entries of the dimension it sizes, by symbol name) over its ``block``, else its
        :attr:`Symbol.size`; symbols with neither are left out."""
        out: dict[str, int] = {}
        for name, sym in self.symbols.items():
            if name in entries:
                out[name] = entries[name] // sym.block
            elif sym.size is not None:
                out[name] = sym.size
        return out

    def attribute_mismatches(self, module: object, sizes: Mapping[str, int]
                             ) -> dict[str, str]:
        """The declared attributes of ``module`` that do not equal their expression over
        ``sizes`` (see :meth:`sizes`), each with what is wrong (an attribute reading a
        symbol missing from ``sizes`` is not judged)."""
        state = vars(module)
        out: dict[str, str] = {}
        for attr, expr in self.attributes.items():
            if any(s not in sizes for s in expr.symbols):
                continue
            current = state.get(attr)
            if type(current) is not int:
                out[attr] = f"the module holds no int {attr!r} (it has {current!r})"
                continue
            value = expr.evaluate(sizes)[0]
            if value != current:
                shown = ", ".join(f"{s}={sizes[s]}" for s in expr.symbols)
                out[attr] = f"{attr} is {current}, {expr} gives {value} with {shown}"
        return out

    @property
    def is_shape_preserving(self) -> bool:
        return self._is_shape_preserving

    @property
    def leading_dims_are_batch(self) -> bool:
        return self._leading_dims_are_batch

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.symbols.items())
        attrs = "".join(f", {k}={str(v)!r}" for k, v in self.attributes.items())
        return (f"SymInfo({inner}, is_shape_preserving={self._is_shape_preserving})"
                + (f".declare({attrs[2:]})" if attrs else ""))


SymInfoFactory = Callable[[nn.Module], SymInfo]


@dataclass(frozen=True)
class SymGroup:
    """One searchable cross-layer size: a root symbol and every symbol tied to it.

    ``size`` counts *units*; ``unit`` is how many entries of the root symbol's dimension one
    unit spans (1 for channels; ``head_dim`` where the group's units are attention heads, the
    channels of a conv group for grouped convs). ``members`` lists
    ``(module_qualname, symbol_name)`` for every symbol that must change with the root, the
    root first; a parameter used directly in the graph appears as ``(owner, "name:dim")``.
    """

    name: str
    size: int
    is_sortable: bool
    members: tuple[tuple[str, str], ...]
    unit: int = 1
    id: int = field(repr=False, compare=False, default=-1)
    #: names of the other groups that must keep as many units as this one (the blocks of a
    #: ``chunk``, cut at equal sizes at run time); their entries are chosen independently
    same_size: tuple[str, ...] = ()
    #: the fewest units a resize may keep (a router's ``topk`` over the group needs ``k``)
    min_size: int = 1
    #: a router picks this group's entries by value: the positions its ``topk`` returns index
    #: the members (the experts of a mixture of experts). Permuting the entries is exact;
    #: dropping some changes what the router picks (that is expert pruning), so dropping is
    #: not zeroing and the value oracle does not check the group
    routed: bool = False
    #: a kept size other than the whole group is a multiple of ``step`` units: what a plugin
    #: says the model's own kernels need (``fxsym_group_steps``: transformers' ``grouped_mm``
    #: experts kernel takes 16-byte strides only); :func:`fxsym.plan` rounds to it,
    #: :func:`fxsym.search.sizes_for` refuses another size and :func:`fxsym.resize` keeps it
    #: with a :class:`~fxsym.ResizeWarning`. ``step_reason`` says why
    step: int = 1
    step_reason: str = ""


def combine_step(now: tuple[int, str], entries: int, unit: int, reason: str
                 ) -> tuple[int, str]:
    """A group's ``(step, reason)`` (:attr:`SymGroup.step`, in units of ``unit`` entries) once
    it must also keep multiples of ``entries`` entries for ``reason``: the least common
    multiple of the two steps, the reasons joined."""
    step = entries // math.gcd(entries, unit)
    return math.lcm(now[0], step), "; ".join(r for r in (now[1], reason) if r)


@dataclass(frozen=True)
class DepthGroup:
    """A model's depth as a group: a ``ModuleList`` (or ``Sequential``) whose blocks the
    analysis proved residual, each unit one block (see :mod:`fxsym.analysis.depth`).

    Its units are modules, not slices of tensors, so it is not a :class:`SymGroup` and is
    not in :meth:`SymMap.groups`: :meth:`SymMap.depth_groups` lists it. :func:`fxsym.resize`
    takes its ``name`` like a group's: ``{"model.layers.depth": [0, 1, 3]}`` keeps those
    blocks, in that order, and renumbers them.

    ``container`` is the list's qualified name, ``blocks`` its children's, in order.
    ``positions`` are ``(path inside a block, attribute)`` of the int attributes that count
    the blocks (``layer_idx``: block ``i`` holds ``i`` wherever it holds one, in the attention
    of some blocks and the state-space mixer of others), set to each kept block's new
    position. ``feature_dim`` is the dim of the residual stream holding its
    features (the dim the block importance compares along). ``varying_inputs`` describes the
    values, other than the stream, that the blocks read but not all alike (one attention mask
    for some blocks, another for others): which block reads which is chosen by position, and a
    resize needs a plugin that makes the choice follow the kept blocks (the hf plugin's
    per-layer config lists). ``stream_group`` names the :class:`SymGroup` of the stream's
    features (a model's hidden size), if that is searchable.
    """

    name: str
    container: str
    size: int
    blocks: tuple[str, ...]
    positions: tuple[tuple[str, str], ...] = ()
    feature_dim: int = -1
    varying_inputs: tuple[str, ...] = ()
    #: the searchable group of the stream's features (the hidden size), if it is one
    stream_group: str | None = None


#: ``(module_qualname, symbol_name)``; a parameter member is ``(owner, "name:dim")``
SymbolKey = tuple[str, str]


# an int attribute read as a size is a member ``(owner, "attr:name")``, element ``i`` of a
# tuple of ints ``(owner, "attr:name[i]")``; these read and write the attribute by that name
def attribute_value(mod: Any, name: str) -> Any:
    """The value of attribute member ``name`` of ``mod``: ``"hidden"``, ``"config.hidden"``
    (a field of an object it holds) or ``"shape[i]"`` (element ``i`` of a tuple); ``None`` if
    there is none."""
    base, index = _element(name)
    value = mod
    for part in base.split("."):
        value = getattr(value, part, None)
    if index is None:
        return value
    return value[index] if isinstance(value, tuple) and index < len(value) else None


def set_attribute(mod: Any, name: str, n: int) -> None:
    """Set attribute member ``name`` of ``mod`` to ``n`` (for ``"shape[i]"``: a new tuple with
    element ``i`` replaced)."""
    base, index = _element(name)
    if index is None:
        setattr(mod, base, n)
        return
    value = tuple(getattr(mod, base))
    setattr(mod, base, (*value[:index], n, *value[index + 1:]))


def _element(name: str) -> tuple[str, int | None]:
    if name.endswith("]") and "[" in name:
        base, _, index = name[:-1].rpartition("[")
        if index.isdigit():
            return base, int(index)
    return name, None


class Segment(Protocol):
    """A run of entries along one tensor dimension (``fxsym.analysis.Seg``): ``units`` units
    of group ``group`` (``None``: of fixed size), each ``block`` consecutive entries long."""

    @property
    def group(self) -> int | None: ...

    @property
    def units(self) -> int: ...

    @property
    def block(self) -> int: ...


class GroupIndex(Protocol):
    """The analysis' union-find of groups (``fxsym.analysis.GroupTable``), read-only.

    A group id from a :class:`Segment` is looked up through its root, :meth:`find`.
    """

    @property
    def units(self) -> Sequence[int]:
        """Per root: how many units the group has."""
        ...

    def find(self, g: int) -> int:
        """The root of group ``g``: the id of the group it was merged into."""
        ...

    def reason(self, g: int) -> str | None:
        """Why group ``g`` is constant (the first boundary it met), or ``None``."""
        ...


@dataclass(frozen=True)
class GroupAnalysis:
    """What :func:`fxsym.analyze` found about a model's groups, as attached to its SymMap.

    ``groups`` are the searchable groups in graph order (``SymGroup.id`` is a root of
    ``table``). ``symbol_dims`` gives, for every symbol the traced graph reached and every
    parameter member, the segments of the tensor dimension it sizes; ``param_members`` says
    which of its keys are parameter members (a parameter used directly in the graph, sliced
    along one dim) rather than symbols. ``producers`` lists, per root of a searchable group,
    the symbols that create the group's values (whose weights rank its entries).
    """

    groups: tuple[SymGroup, ...]
    symbol_dims: Mapping[SymbolKey, Sequence[Segment]]
    param_members: frozenset[SymbolKey]
    table: GroupIndex
    producers: Mapping[int, tuple[SymbolKey, ...]]
    #: the parameter members an op rule made the producer of a dim (the weight of a
    #: functional ``linear``/``conv``/``embedding``/``matmul`` in a module traced into), in
    #: searchable groups or not
    param_producers: frozenset[SymbolKey] = frozenset()
    #: the layout of every tensor value of the traced graph, by node name: a ``TensorLayout``
    #: (see :mod:`fxsym.analysis.layout`; group ids are looked up through ``table``), tuples
    #: and dicts of them for containers, ``None`` for anything else (sizes included): where
    #: each group's entries lie in every tensor, which the value oracle reads to find the ops
    #: that read a group (:func:`fxsym.oracles.check_values`)
    node_layouts: Mapping[str, Any] = field(default_factory=dict)
    #: the depth groups (:class:`DepthGroup`): stacks of blocks proven residual
    depth_groups: tuple[DepthGroup, ...] = ()


class SymMap:
    """The SymInfos of a model's modules and, once analyzed, its cross-layer groups.

    A SymMap describes the model as analyzed: after :func:`fxsym.resize` changed the model it
    is *stale* (:attr:`is_stale`) and must be computed again.
    """

    def __init__(self, model: nn.Module) -> None:
        from .registry import get_registry
        from .tracer.report import TraceReport

        self.model = model
        #: the registry the SymInfos came from; resizing the model looks up its rules here
        self.registry: Registry = get_registry()
        #: what :func:`fxsym.analyze` reported while tracing (fallback leaves, boundaries);
        #: empty until then
        self.trace_report: TraceReport = TraceReport()
        self._graph_module: fx.GraphModule | None = None
        #: the outputs whose sizes the analysis kept (``None``: every output); see
        #: :mod:`fxsym.analysis.outputs`
        self.output_contract: tuple[str | int, ...] | None = None
        #: the analysis options that differ from the defaults (``{"norm_groups": "keep"}``;
        #: see :mod:`fxsym.analysis.options`)
        self.analysis_options: dict[str, Any] = {}
        #: state the model derives, found by the trace: by module qualified name, each
        #: attribute and its kind (``modstate.CACHE``: cleared by a resize of the module or a
        #: submodule; ``modstate.DERIVED``: such a resize refuses while it holds tensors;
        #: ``modstate.INVARIANT``: computed from nothing a resize changes, left as it is)
        self.derived_state: dict[str, dict[str, str]] = {}
        self._map: dict[nn.Module, SymInfo] = {}
        self._mod_to_name: dict[nn.Module, str] = {}
        self._analysis: GroupAnalysis | None = None
        self._stale = False
        registry = self.registry
        stack: list[tuple[str, nn.Module]] = [("", model)]
        seen: set[int] = set()
        while stack:
            name, mod = stack.pop()
            if id(mod) in seen:
                continue
            seen.add(id(mod))
            entry = registry.sym_info_entry(type(mod))
            if entry is not None:
                self._map[mod] = entry.factory(mod)
                self._mod_to_name[mod] = name
                if entry.leaf:
                    continue
            children = list(mod.named_children())
            for cname, child in reversed(children):
                stack.append((f"{name}.{cname}" if name else cname, child))
        # keep the model's own module order
        order = {id(m): i for i, m in enumerate(model.modules())}
        self._map = dict(sorted(self._map.items(), key=lambda kv: order.get(id(kv[0]), 0)))

    @property
    def graph_module(self) -> fx.GraphModule | None:
        """The graph :func:`fxsym.analyze` traced and analyzed, as a GraphModule that runs
        like the model. Its Python code is generated on the first read here (the analysis
        itself reads only the graph: ``fxsym.tracer.DeferredGraphModule``)."""
        gm = self._graph_module
        if gm is not None and getattr(gm, "code_pending", False):
            gm.recompile()
        return gm

    @graph_module.setter
    def graph_module(self, gm: fx.GraphModule | None) -> None:
        self._graph_module = gm

    @property
    def graph(self) -> fx.Graph | None:
        """The graph :func:`fxsym.analyze` traced and analyzed, without generating the
        GraphModule's code (reading it writes nothing)."""
        return None if self._graph_module is None else self._graph_module.graph

    @property
    def example_inputs(self) -> Any:
        """The example inputs :func:`fxsym.analyze` traced the model with (``None`` without a
        trace), read without generating the GraphModule's code."""
        return getattr(self._graph_module, "example_inputs", None)

    # -- registration (the in-application way; plugins use hooks) ---------------------------
    @classmethod
    def register(
        cls,
        nn_cls: type[nn.Module] | Iterable[type[nn.Module]],
        is_explicit_leaf: bool = True,
        *,
        resize: Callable[[nn.Module, str, Any], None] | None = None,
        importance: Callable[[nn.Module, str], Any] | None = None,
        value: Callable[[nn.Module, tuple[Any, ...], dict[str, Any]], Any] | None = None,
    ) -> Callable[[SymInfoFactory], SymInfoFactory]:
        """Decorator registering ``factory(module) -> SymInfo`` for one or more module classes.

        A user's registration beats every plugin's. ``is_explicit_leaf`` makes the tracer keep
        such modules as single ``call_module`` nodes. ``resize(module, symbol, index)`` and
        ``importance(module, symbol)`` and ``value(module, args, kwargs)`` are what the
        ``fxsym_register_sym_infos`` hook takes: without ``resize``, ``fxsym.resize`` refuses
        groups holding such a module.
        """
        from .registry import get_registry

        classes = [nn_cls] if isinstance(nn_cls, type) else list(nn_cls)

        def decorator(factory: SymInfoFactory) -> SymInfoFactory:
            for c in classes:
                get_registry().register_user(c, factory, leaf=is_explicit_leaf, resize=resize,
                                             importance=importance, value=value)
            return factory

        return decorator

    @classmethod
    def unregister(cls, nn_cls: type[nn.Module]) -> None:
        """Remove a registration made with :meth:`register`; ``KeyError`` if there is none."""
        from .registry import get_registry

        get_registry().unregister_user(nn_cls)

    def __deepcopy__(self, memo: dict[int, Any]) -> SymMap:
        """A deep copy that shares :attr:`registry` (it belongs to the plugin manager, not to
        the model) and the analysis' node layouts (plain immutable data, one entry per node of
        the graph: copying it for every oracle copy would cost more than the model)."""
        memo[id(self.registry)] = self.registry
        analysis = self.__dict__.get("_analysis")
        if analysis is not None:
            memo[id(analysis.node_layouts)] = analysis.node_layouts
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = copy.deepcopy(value, memo)
        return clone

    # -- mapping API ------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._map)

    def __bool__(self) -> bool:
        return bool(self._map)

    def __contains__(self, key: object) -> bool:
        return key in self._map

    def __iter__(self) -> Iterator[nn.Module]:
        return iter(self._map)

    def __getitem__(self, key: nn.Module) -> dict[str, Symbol]:
        return self._map[key].symbols

    def items(self) -> Iterator[tuple[nn.Module, dict[str, Symbol]]]:
        for mod, info in self._map.items():
            yield mod, info.symbols

    def pop(self, key: nn.Module) -> dict[str, Symbol]:
        self._mod_to_name.pop(key)
        return self._map.pop(key).symbols

    def named_modules(self) -> Iterator[tuple[str, nn.Module]]:
        for mod in self._map:
            yield self._mod_to_name[mod], mod

    def named_sym_dicts(self) -> Iterator[tuple[str, dict[str, Symbol]]]:
        for mod, info in self._map.items():
            yield self._mod_to_name[mod], info.symbols

    def named_symbols(
        self,
        key: nn.Module | None = None,
        free: bool | None = None,
        dynamic: bool | None = None,
        searchable: bool | None = None,
        constant: bool | None = None,
    ) -> Iterator[tuple[str, Symbol]]:
        """Yield ``(qualified_name, symbol)``, optionally filtered by state.

        With no filter every symbol is yielded. A filter set to ``True`` selects that state
        (several ``True`` filters select their union); a filter set to ``False`` excludes it.
        """
        flags = {"free": free, "dynamic": dynamic, "searchable": searchable, "constant": constant}
        if any(v is True for v in flags.values()):
            wanted = {k for k, v in flags.items() if v is True}
        else:
            wanted = {k for k, v in flags.items() if v is not False}
        mods = self._map if key is None else {key: self._map[key]}
        for mod, info in mods.items():
            prefix = self._mod_to_name[mod]
            prefix = f"{prefix}." if prefix and key is None else ""
            for sname, sym in info.symbols.items():
                if any(getattr(sym, f"is_{state}") for state in wanted):
                    yield prefix + sname, sym

    def name_of(self, mod: nn.Module) -> str:
        """The qualified name of ``mod`` in the model; ``KeyError`` if it has no SymInfo here."""
        return self._mod_to_name[mod]

    def sym_info(self, mod: nn.Module) -> SymInfo:
        """The SymInfo of ``mod``; ``KeyError`` if it has none here."""
        return self._map[mod]

    def get_symbol(self, mod: nn.Module, name: str) -> Symbol:
        return self._map[mod].symbols[name]

    def set_symbol(self, mod: nn.Module, name: str, symbol: Symbol) -> None:
        self._map[mod].symbols[name] = symbol

    def is_shape_preserving(self, key: nn.Module) -> bool:
        return self._map[key].is_shape_preserving

    def add_sym_info(self, key: nn.Module, sym_info: SymInfo) -> None:
        """Attach a SymInfo to one module of the model by hand."""
        for name, mod in self.model.named_modules():
            if mod is key:
                self._map[mod] = sym_info
                self._mod_to_name[mod] = name
                return
        raise ValueError(f"{type(key).__name__} is not a module of this model")

    def prune(self) -> None:
        """Drop the modules whose symbols are all constant."""
        for mod in [m for m, i in self._map.items()
                    if all(s.is_constant for s in i.symbols.values())]:
            del self._map[mod]
            del self._mod_to_name[mod]

    # -- analysis ---------------------------------------------------------------------------
    def attach_analysis(self, analysis: GroupAnalysis) -> None:
        """Record what :func:`fxsym.analyze` found; :meth:`groups` offers its groups."""
        self._analysis = analysis

    @property
    def analysis(self) -> GroupAnalysis | None:
        """What :func:`fxsym.analyze` found, or ``None`` before an analysis was attached."""
        return self._analysis

    def mark_stale(self) -> None:
        """Record that the model changed since this SymMap was computed (a resize did it)."""
        self._stale = True

    @property
    def is_stale(self) -> bool:
        """Whether the model changed since this SymMap was computed; analyze it again."""
        return self._stale

    # -- groups -----------------------------------------------------------------------------
    def groups(self) -> list[SymGroup]:
        """The searchable cross-layer groups found by :func:`fxsym.analyze`, in graph order."""
        return [] if self._analysis is None else list(self._analysis.groups)

    def depth_groups(self) -> list[DepthGroup]:
        """The depth groups found by :func:`fxsym.analyze` (stacks of residual blocks whose
        blocks may be dropped), in module order; not among :meth:`groups`."""
        return [] if self._analysis is None else list(self._analysis.depth_groups)

    def depth_group(self, name: str) -> DepthGroup:
        """The depth group called ``name``; ``KeyError`` if there is none."""
        for g in self.depth_groups():
            if g.name == name:
                return g
        raise KeyError(name)

    def group(self, name: str) -> SymGroup:
        for g in self.groups():
            if g.name == name:
                return g
        raise KeyError(name)

    def why_constant(self, qualname: str, symbol: str) -> str | None:
        """Why a cross-layer symbol cannot change (the first boundary its group met), or
        ``None`` if it belongs to a searchable group."""
        analysis = self._analysis
        dim = None if analysis is None else analysis.symbol_dims.get((qualname, symbol))
        if analysis is None or dim is None:
            return "not reached by the traced graph (unused, or inside a leaf without a SymInfo)"
        table = analysis.table
        groups = [s.group for s in dim if s.group is not None]
        reasons = [table.reason(g) for g in groups]
        if not reasons:
            return "its dimension is fixed where it enters the module (a model input or a literal)"
        live = {g.id for g in analysis.groups}
        if any(table.find(g) in live for g in groups):
            return None
        return next((r for r in reasons if r), "no searchable producer feeds its group")

    def __repr__(self) -> str:
        groups = self.groups()
        lines = [f"SymMap(model={type(self.model).__name__}, groups={len(groups)})"]
        for g in groups:
            lines.append(f"  {g.name}: size={g.size} members={len(g.members)}")
        return "\n".join(lines)
