"""Where a long call's time goes: its steps are *phases*, timed when someone asks.

Design. A step of a long computation (:func:`fxsym.prune_checkpoint`: building, analysing,
the calibration pass, writing ...) is wrapped in :func:`phase`. Unless a caller records
(:func:`recording`, around the call: ``fxsym prune --times``, the benchmarks), a phase only
reads one context variable: timing costs nothing when nobody asks. Recording, each phase's
wall time is added to the record under its name, in the order phases first start. The time
is *exclusive*: a phase started inside another pauses the outer one, so the record's values
add up to the time spent inside phases, and what is left of the call's time ran in none.

The record lives in a :class:`contextvars.ContextVar`: a phase entered in another thread (the
lock-step batches of :mod:`fxsym.prune.lockstep`) is not recorded there, and two recordings in two
threads do not mix.

Imports from fxsym: nothing (every room may use it).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

__all__ = ["Record", "format_record", "phase", "recording"]


@dataclass
class Record:
    """Seconds by phase name (exclusive, see the module docstring), in the order phases first
    started, and the running phases (innermost last) with the time each last resumed."""

    seconds: dict[str, float] = field(default_factory=dict)
    running: list[tuple[str, float]] = field(default_factory=list)

    def _pause(self, now: float) -> None:
        if self.running:
            name, since = self.running[-1]
            self.seconds[name] = self.seconds.get(name, 0.0) + now - since

    def _resume(self, now: float) -> None:
        if self.running:
            self.running[-1] = (self.running[-1][0], now)


_RECORD: ContextVar[Record | None] = ContextVar("fxsym_phase_record", default=None)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Time the block as phase ``name`` if a :func:`recording` is active in this context."""
    record = _RECORD.get()
    if record is None:
        yield
        return
    now = time.perf_counter()
    record._pause(now)
    record.seconds.setdefault(name, 0.0)
    record.running.append((name, now))
    try:
        yield
    finally:
        now = time.perf_counter()
        record._pause(now)
        record.running.pop()
        record._resume(now)


@contextmanager
def recording() -> Iterator[dict[str, float]]:
    """Record the phases run inside the block; yields the ``{name: seconds}`` being filled
    (complete when the block ends)."""
    record = Record()
    token = _RECORD.set(record)
    try:
        yield record.seconds
    finally:
        _RECORD.reset(token)


def format_record(seconds: dict[str, float], total: float | None = None) -> str:
    """One line per phase, ``  name  12.3 s  45 %`` (the share of ``total``, default the sum),
    and a last line for the time in no phase when ``total`` is given."""
    whole = total if total is not None else sum(seconds.values())
    rows = list(seconds.items())
    if total is not None:
        rows.append(("(in no phase)", max(total - sum(seconds.values()), 0.0)))
    width = max((len(n) for n, _ in rows), default=0)
    return "\n".join(f"  {n.ljust(width)}  {s:7.2f} s  {100 * s / whole if whole else 0:3.0f} %"
                     for n, s in rows)
