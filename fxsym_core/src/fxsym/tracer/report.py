"""The trace report: what fxsym could not follow exactly, and why.

The tracer records submodules that fell back to leaves and values it could not compute; the
analyzer adds the boundaries that made groups constant. Every entry names a module path or a
node, so a user can act on it (register a SymInfo, add a leaf policy, an op rule).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class ReportEntry:
    """One thing the tracer or analyzer could not follow exactly."""

    kind: str  #: "leaf-fallback", "unknown-value", "boundary", ...
    where: str  #: module path or node name
    message: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.where}: {self.message}"


@dataclass
class TraceReport:
    """Entries recorded while tracing and analyzing one model."""

    entries: list[ReportEntry] = field(default_factory=list)

    def add(self, kind: str, where: str, message: str) -> None:
        entry = ReportEntry(kind, where, message)
        if entry not in self.entries:
            self.entries.append(entry)

    def of_kind(self, kind: str) -> list[ReportEntry]:
        return [e for e in self.entries if e.kind == kind]

    @property
    def fallbacks(self) -> list[ReportEntry]:
        """Submodules that failed to trace and were kept as leaves."""
        return self.of_kind("leaf-fallback")

    def __len__(self) -> int:
        return len(self.entries)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.entries)

    def __str__(self) -> str:
        if not self.entries:
            return "trace report: nothing to report"
        return "\n".join(["trace report:", *(f"  {e}" for e in self.entries)])
