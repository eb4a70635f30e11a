"""A module's symbols (:class:`SymInfo`) and the int attributes that derive from them
(:class:`SizeExpr`: ``num_heads = heads``, ``head_dim = hidden // heads``).

A SymInfo is what a plugin (or a user's :meth:`fxsym.SymMap.register`) says about one module:
its symbols by name, whether it preserves its input's shape, whether its leading dims are
batch dims, and its declared attributes, which a resize sets after each rule call. A
:class:`SizeExpr` is a product of factors, optionally floor-divided by one more: the only
arithmetic a declaration may use, so a resize can check it exactly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from torch import nn

from .symbol import Symbol

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
