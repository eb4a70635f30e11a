"""Helpers shared by the benchmark scripts (plain scripts; run them from the repo root).

Tables and progress come from :mod:`fxsym.prune.console`: rich at a terminal, plain text when
piped.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from fxsym.prune.console import render_table, track

__all__ = ["input_size", "median_time", "table", "track", "zoo_names"]


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
    """The rows as a table: drawn by rich at a terminal, plain aligned columns otherwise."""
    return render_table(rows, header)
