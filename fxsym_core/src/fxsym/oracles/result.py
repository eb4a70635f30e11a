"""What an oracle returns: :class:`OracleResult`, whose ``status`` is ``"ok"``, ``"failed"`` or
``"not checked"`` (nothing checked is not ok), and the seeds the oracles run with by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

Status = Literal["ok", "failed", "not checked"]


#: the seeds each oracle runs with by default
SEEDS = (0, 1, 2)


@dataclass
class OracleResult:
    """What an oracle checked and which groups failed it.

    ``checked`` counts the groups the oracle exercised; ``failed`` names the groups that broke
    it; ``error`` says what went wrong when no single group can be blamed (or in addition);
    ``details`` lists every individual mismatch found (a member of the wrong size, ...);
    ``notes`` lists doubts that do not fail the check (see :func:`check_shrink`).
    """

    checked: int = 0
    failed: list[str] = field(default_factory=list)
    error: str | None = None
    details: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seeds: tuple[int, ...] = ()
    #: groups the oracle could not check, with the reason (:func:`check_values`: a group
    #: whose dim meets a normalisation is not checked by value)
    unchecked: dict[str, str] = field(default_factory=dict)
    #: the dtype the copies were compared in (float64 unless a note says why not; ``None``
    #: when no copy ran)
    dtype: torch.dtype | None = None

    @property
    def status(self) -> Status:
        if self.failed or self.error is not None:
            return "failed"
        return "ok" if self.checked else "not checked"

    @property
    def ok(self) -> bool:
        """True only when something was checked and nothing failed."""
        return self.status == "ok"

    def __str__(self) -> str:
        lowered = self.dtype is not None and self.dtype != torch.float64
        precision = f", in {str(self.dtype).removeprefix('torch.')}" if lowered else ""
        if self.status == "ok":
            text = f"ok ({self.checked} groups, seeds {list(self.seeds)}{precision})"
            return text + (f", {len(self.unchecked)} not checked" if self.unchecked else "")
        if self.status == "not checked":
            if self.unchecked:
                return f"not checked ({len(self.unchecked)} groups: {self.unchecked})"
            return "not checked (no group to check)"
        shown = "; ".join(self.details[:5])
        return f"FAILED{precision} {self.failed[:5]} {self.error or ''} {shown}".strip()


def _blame(result: OracleResult, name: str) -> None:
    if name not in result.failed:
        result.failed.append(name)
