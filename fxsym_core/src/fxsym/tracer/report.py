"""The trace report: what fxsym could not follow exactly, and why.

The tracer records submodules that fell back to leaves and values it could not compute; the
analyzer adds the boundaries that made groups constant. Every entry names a module path or a
node, so a user can act on it (register a SymInfo, add a leaf policy, an op rule).

An entry about sizes that never were elastic candidates — numbers read from module attributes
that size no tensor, such as a max pool's ``kernel_size`` and ``stride`` — is a *detail*: no
user action could make them change, so iterating the report, ``str(report)``, the command
line and the HTML report leave it out; :attr:`TraceReport.details` and
``report.format(verbose=True)`` (``fxsym analyze --verbose``) show it, and
:attr:`TraceReport.entries` holds every entry.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReportEntry:
    """One thing the tracer or analyzer could not follow exactly."""

    kind: str  #: "leaf-fallback", "unknown-value", "boundary", ...
    where: str  #: module path or node name
    message: str
    #: about sizes that never were elastic candidates: shown only when asked for
    detail: bool = False

    def __str__(self) -> str:
        return f"[{self.kind}] {self.where}: {self.message}"


@dataclass
class TraceReport:
    """Entries recorded while tracing and analyzing one model: iterating it gives those a user
    can act on, :attr:`entries` all of them (the module docstring says which are details)."""

    entries: list[ReportEntry] = field(default_factory=list)

    def add(self, kind: str, where: str, message: str, *, detail: bool = False) -> None:
        entry = ReportEntry(kind, where, message, detail)
        if entry not in self.entries:
            self.entries.append(entry)

    def of_kind(self, kind: str) -> list[ReportEntry]:
        return [e for e in self if e.kind == kind]

    @property
    def fallbacks(self) -> list[ReportEntry]:
        """Submodules that failed to trace and were kept as leaves."""
        return self.of_kind("leaf-fallback")

    @property
    def details(self) -> list[ReportEntry]:
        """The entries about sizes that never were elastic candidates."""
        return [e for e in self.entries if e.detail]

    def format(self, verbose: bool = False) -> str:
        """The report as text, one entry a line; ``verbose`` adds the details."""
        shown = self.entries if verbose else list(self)
        if not shown:
            return "trace report: nothing to report"
        return "\n".join(["trace report:", *(f"  {e}" for e in shown)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __iter__(self) -> Iterator[ReportEntry]:
        return (e for e in self.entries if not e.detail)

    def __str__(self) -> str:
        return self.format()
