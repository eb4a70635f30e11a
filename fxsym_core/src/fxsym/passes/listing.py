"""``fxsym passes``: a readable table of every pass and pattern and who contributed it.

:func:`pass_listing` gathers the rows (the command line draws them with rich at a terminal);
:func:`format_passes` is the same listing as plain text.
"""

from __future__ import annotations

from typing import NamedTuple

from .catalog import CORE, PatternPass, catalog, distribution
from .ordering import order_passes


def _who(src: str) -> tuple[str, str]:
    if src.startswith("<"):
        return src, "fxsym" if src == CORE else src
    return src, distribution(src)


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()
    out = [line, "  ".join("-" * w for w in widths)]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    return out


class PassListing(NamedTuple):
    """What ``fxsym passes`` shows: ``(title, header, rows)`` tables, then note lines."""

    tables: list[tuple[str, list[str], list[list[str]]]]
    notes: list[str]


def format_passes() -> str:
    """Every registered pass (in pipeline order) and pattern, with plugin and distribution."""
    listing = pass_listing()
    lines: list[str] = []
    for title, header, rows in listing.tables:
        lines += ([""] if lines else []) + [title] + _table(header, rows)
    if listing.notes:
        lines += ["", "Op knowledge used by the passes", *listing.notes]
    return "\n".join(lines)


def pass_listing() -> PassListing:
    """The rows of :func:`format_passes`: passes in pipeline order, patterns, op knowledge."""
    cat = catalog()
    ordered = order_passes(list(cat.passes.values()))
    rows = []
    for i, p in enumerate(ordered, 1):
        plugin, dist = _who(cat.pass_sources.get(p.name, "<user>"))
        constraints = []
        if p.after:
            constraints.append("after " + ",".join(p.after))
        if p.before:
            constraints.append("before " + ",".join(p.before))
        kind = "patterns" if isinstance(p, PatternPass) else "pass"
        rows.append(
            [
                str(i),
                p.name,
                kind,
                "yes" if p.default else "no",
                plugin,
                dist,
                "; ".join(constraints) or "-",
            ]
        )
    tables = [("Passes (default pipeline order)",
               ["#", "pass", "kind", "default", "plugin", "distribution", "order"], rows)]
    prow = []
    for pattern, src in cat.patterns:
        plugin, dist = _who(src)
        kind = type(pattern).__name__
        prow.append([pattern.name, pattern.stage, kind, pattern.describe_anchor(), plugin, dist])
    tables.append(("Patterns (applied by the pass named in 'stage'; larger matches win overlaps)",
                   ["pattern", "stage", "kind", "anchor", "plugin", "distribution"], prow))
    extra: dict[tuple[str, str], list[str]] = {}
    for alias, src in cat.aliases:
        extra.setdefault(("aliases", src), []).append(alias.name.removeprefix("alias:"))
    for sem, src in cat.semantics:
        extra.setdefault(("module semantics", src), []).append(sem.cls.__name__)
    notes = []
    for (kind, src), names in extra.items():
        plugin, dist = _who(src)
        notes.append(f"{kind} from {plugin} ({dist}): {', '.join(names)}")
    return PassListing(tables, notes)
