"""Helpers shared by the benchmark scripts (plain scripts; run them from the repo root)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any


def zoo_names() -> list[str]:
    import torchvision

    return torchvision.models.list_models(module=torchvision.models)


def input_size(name: str) -> int:
    """The smallest input each torchvision family accepts comfortably."""
    if name.startswith(("vit_", "swin", "maxvit")):
        return 224
    return 299 if name.startswith("inception") else 64


def median_time(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(rows: list[list[Any]], header: list[str]) -> str:
    cells = [[str(c) for c in row] for row in [header, *rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                       enumerate(zip(row, widths))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
