"""What a search gives: each uniform :class:`Candidate` tried (its depth, sizes by role,
parameters, estimated damage and loss), the :class:`SearchResult` (the candidates, the kept
one, the depths skipped), as JSON rows (:meth:`SearchResult.rows`, what
``plan.extra["search"]`` records) and as a :func:`table`; and what a plan made for a
parameter target records of it (:func:`target_record`).

Imports from fxsym: console, planning.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..console import format_table
from ..planning import Plan


@dataclass(frozen=True)
class Candidate:
    """One uniform architecture the search tried: its depth, the size of the stream role
    (:attr:`fxsym.prune.roles.Roles.stream`) and the width of each width role (``None``: the model
    has no such group or the search keeps it; a role of several width classes: its widest
    class's), and of each width class searched (``classes``: ``(label, entries)``,
    :attr:`fxsym.prune.roles.Roles.classes`). ``candidate.NAME`` is the size of the role ``NAME``
    (the hf plugin's ``candidate.hidden``, ``candidate.ffn``)."""

    layers: int
    stream: int | None
    params: int
    loss: float = math.nan
    plan: Plan | None = field(default=None, repr=False, compare=False)
    classes: tuple[tuple[str, int], ...] = ()
    #: the damage the calibration pass estimates (:func:`fxsym.shortlist.damage`)
    damage: float = math.nan
    #: whether the candidate was scored by its loss (it was on the shortlist)
    scored: bool = True
    #: the stream role's name, or ``None`` where no plugin declares one
    stream_role: str | None = None
    #: ``(role, entries)`` of every width role declared (``None``: not set)
    role_widths: tuple[tuple[str, int | None], ...] = ()

    def __getattr__(self, name: str) -> int | None:
        own = vars(self)
        if not name.startswith("_"):
            if name == own.get("stream_role"):
                stream: int | None = own.get("stream")
                return stream
            for role, entries in own.get("role_widths", ()):
                if role == name:
                    return entries  # type: ignore[no-any-return]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def widths(self) -> dict[str, int]:
        """``{role: entries}`` of the width roles the candidate sets."""
        return {k: v for k, v in self.role_widths if v is not None}

    def sizes(self) -> dict[str, int | None]:
        """``{role: entries}`` of the stream role and of every width role declared."""
        return {**({self.stream_role: self.stream} if self.stream_role else {}),
                **dict(self.role_widths)}


@dataclass(frozen=True)
class SearchResult:
    """The candidates tried (in the order tried) and the best one's plan."""

    candidates: tuple[Candidate, ...]
    best: Candidate
    #: the depths not tried, each with why (:func:`candidates`' ``skipped``)
    skipped: tuple[str, ...] = ()

    @property
    def plan(self) -> Plan:
        assert self.best.plan is not None
        return self.best.plan

    def rows(self) -> list[dict[str, Any]]:
        """The candidates as JSON data (what :func:`fxsym.prune_checkpoint` records in the
        plan's ``extra["search"]``), the kept one marked ``kept``."""
        return [{"layers": c.layers, **c.sizes(), "classes": dict(c.classes), "params": c.params,
                 "loss": None if math.isnan(c.loss) else c.loss, "kept": c is self.best,
                 "damage": None if math.isnan(c.damage) else c.damage, "scored": c.scored}
                for c in self.candidates]

    def table(self) -> str:
        """The candidates as a table, the kept one marked, and the depths skipped."""
        return table(self.rows()) + "".join(f"\nskipped: {why}" for why in self.skipped)


#: the keys of a row (:meth:`SearchResult.rows`) that are no role's size
_ROW_KEYS = frozenset({"layers", "classes", "params", "loss", "kept", "damage", "scored"})


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """Candidates (:meth:`SearchResult.rows`) as a table, the kept one marked: the stream
    role's column (a row's first role, unless a width class is of that role), then a column
    for each width role some candidate sets (the first where none does), or for each of its
    width classes where it has several."""
    keys = list(dict.fromkeys(k for r in rows for k in r if k not in _ROW_KEYS))
    labels = list(dict.fromkeys(k for r in rows for k in r.get("classes") or {}))
    first_is_width = bool(keys) and any(c.partition(" ")[0] == keys[0] for c in labels)
    stream, width_keys = ([], keys) if first_is_width else (keys[:1], keys[1:])
    roles_set = ([k for k in width_keys if any(r.get(k) is not None for r in rows)]
                 or width_keys[:1])
    shown: list[tuple[str, str | None]] = []  # (column, role or width class)
    for k in roles_set:
        own = [c for c in labels if c.partition(" ")[0] == k and c != k]
        shown += [(c, None) for c in own] if own else [(k, k)]

    def value(r: Mapping[str, Any], column: str, role: str | None) -> Any:
        return r.get(role) if role is not None else (r.get("classes") or {}).get(column)

    def loss(r: Mapping[str, Any]) -> str:
        if not r.get("scored", True):
            return "not scored"
        return "nan" if r["loss"] is None else f"{r['loss']:.4f}"

    damaged = any(r.get("damage") is not None for r in rows)
    return format_table([[r["layers"], *(r.get(k) for k in stream),
                          *(value(r, c, k) for c, k in shown), f"{r['params']:,}",
                          *([f"{r['damage']:.4f}" if r.get("damage") is not None else ""]
                            if damaged else []),
                          loss(r), "<- kept" if r["kept"] else ""] for r in rows],
                        ["layers", *stream, *(c.replace("_", " ") for c, _ in shown),
                         "params", *(["damage"] if damaged else []), "calib loss", ""])


def target_record(target: int, active: bool, reached: int, *, non_embedding: bool = False
                  ) -> dict[str, Any]:
    """What a plan made for a parameter target records of it (``plan.extra["target"]``): the
    target given, whether it counts active (or non-embedding) parameters, and the count the
    plan reached."""
    return {"params": target, "active": active, "reached": reached,
            **({"non_embedding": True} if non_embedding else {})}


def counted(active: bool, non_embedding: bool) -> str:
    """What a target counts, as a message says it."""
    return ("active parameters" if active else "non-embedding parameters" if non_embedding
            else "parameters")
