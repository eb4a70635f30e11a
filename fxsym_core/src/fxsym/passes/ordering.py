"""Order passes by their ``before``/``after`` constraints.

Constraints are hard, the given order is soft: among the passes whose predecessors have all
run, the earliest in the given order (registration order, or the caller's list) runs next.
``"*"`` stands for every other pass that does not itself use ``"*"`` on the same side, so a
pass with ``after=("*",)`` runs last without fighting another such pass. A cycle raises
:class:`~fxsym.errors.PassError` naming the passes involved.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from ..errors import PassError
from .base import Pass


def order_passes(passes: Sequence[Pass]) -> list[Pass]:
    """Sort ``passes`` topologically (stable with respect to the given order)."""
    names = {p.name: i for i, p in enumerate(passes)}
    if len(names) != len(passes):
        dupes = sorted({p.name for p in passes if sum(q.name == p.name for q in passes) > 1})
        raise PassError(f"the pipeline names these passes twice: {', '.join(dupes)}")
    succ: list[set[int]] = [set() for _ in passes]

    def edge(a: int, b: int) -> None:
        if a != b:
            succ[a].add(b)

    def others(target: str, side: str) -> list[int]:
        """The passes a constraint names: one by name, or ``*`` for all without their own."""
        if target == "*":
            return [j for j, q in enumerate(passes) if "*" not in getattr(q, side)]
        return [names[target]] if target in names else []

    for i, p in enumerate(passes):
        for target in p.before:
            for j in others(target, "before"):
                edge(i, j)
        for target in p.after:
            for j in others(target, "after"):
                edge(j, i)
    indegree = [0] * len(passes)
    for targets in succ:
        for j in targets:
            indegree[j] += 1
    ready = [i for i, d in enumerate(indegree) if d == 0]
    heapq.heapify(ready)
    out: list[Pass] = []
    while ready:
        i = heapq.heappop(ready)
        out.append(passes[i])
        for j in succ[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    if len(out) != len(passes):
        stuck = [passes[i].name for i, d in enumerate(indegree) if d > 0]
        raise PassError(
            "the before/after constraints of these passes form a cycle: " + ", ".join(stuck)
        )
    return out
