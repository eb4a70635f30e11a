"""Module attributes declared as derived from symbols (:meth:`fxsym.SymInfo.declare`).

:func:`fxsym.resize` plans them with :func:`plan_declared` before it touches the model — every
declaration must hold before the resize and give a whole value of at least 1 after it — and
then, after each resize rule call on a module, :meth:`Declared.follow` sets the attributes that
read the symbol just resized. A rule that reads an attribute (an attention's ``head_dim`` to
find its rows) so sees one that matches the weights as they are at that moment.

Imports from fxsym: errors, symbols.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from torch import nn

from ..errors import ResizeError
from ..symbols import SymbolKey, SymInfo, SymMap


@dataclass
class Declared:
    """The declared attributes of one module during a resize, and its symbols' sizes."""

    module: nn.Module
    qualname: str
    info: SymInfo
    #: each symbol's size in its own units as the module is now
    sizes: dict[str, int]

    def follow(self, sname: str, entries: int) -> None:
        """The resize rule just resized symbol ``sname`` to ``entries`` entries: set the
        attributes that read it."""
        sym = self.info.symbols.get(sname)
        if sym is None:
            return
        self.sizes[sname] = entries // sym.block
        for attr, expr in self.info.attributes.items():
            if sname in expr.symbols:
                setattr(self.module, attr, expr.evaluate(self.sizes)[0])


def symbol_sizes(symmap: SymMap, module: nn.Module,
                 lengths: Mapping[SymbolKey, int] | None = None) -> dict[str, int]:
    """Each symbol of ``module``'s SymInfo: its size in its own units
    (:meth:`SymInfo.sizes`), from the entries of the dimension it sizes as ``lengths`` gives
    them, else as analyzed; symbols of unknown size are left out."""
    name = symmap.name_of(module)
    dims = symmap.analysis.symbol_dims if symmap.analysis is not None else {}
    entries: dict[str, int] = {}
    for sname in symmap.sym_info(module).symbols:
        key = (name, sname)
        if lengths is not None and key in lengths:
            entries[sname] = lengths[key]
        elif key in dims:
            entries[sname] = sum(seg.units * seg.block for seg in dims[key])
    return symmap.sym_info(module).sizes(entries)


def plan_declared(symmap: SymMap, lengths: Mapping[SymbolKey, int]) -> dict[str, Declared]:
    """By qualified name, the modules whose declared attributes read a symbol in ``lengths``
    (entries each resized symbol keeps); raises :class:`ResizeError` if one cannot follow."""
    out: dict[str, Declared] = {}
    for name, mod in symmap.named_modules():
        info = symmap.sym_info(mod)
        changed = {s for s in info.symbols if (name, s) in lengths}
        attrs = {a: e for a, e in info.attributes.items() if changed & set(e.symbols)}
        if not attrs:
            continue
        before, after = symbol_sizes(symmap, mod), symbol_sizes(symmap, mod, lengths)
        for attr, expr in attrs.items():
            where = f"{name}.{attr} = {expr}"
            unknown = [s for s in expr.symbols if s not in before]
            if unknown:
                raise ResizeError(f"{where}: the size of {', '.join(unknown)} is unknown (not "
                                  "reached by the analysis, no Symbol.size)")
        for attr, problem in info.attribute_mismatches(mod, before).items():
            if attr in attrs:
                raise ResizeError(f"{name}.{attr} = {info.attributes[attr]}: the declaration "
                                  f"does not hold before the resize ({problem}); fix it")
        for attr, expr in attrs.items():
            value, remainder = expr.evaluate(after)
            if remainder or value < 1:
                raise ResizeError(f"{name}.{attr} = {expr}: the choice gives "
                                  f"{_show(expr, after)}, which leaves "
                                  f"{'a remainder' if remainder else 'no entry'}; choose sizes "
                                  "that keep it whole")
        out[name] = Declared(mod, name, info, before)
    return out


def _show(expr: object, values: Mapping[str, int]) -> str:
    return ", ".join(f"{s}={values[s]}" for s in getattr(expr, "symbols", ()) if s in values)


__all__ = ["Declared", "plan_declared", "symbol_sizes"]
