"""Where the trace called a module whose hooks it does not see: the sites the analysis pins.

A forward hook left out of the trace (nobody declared it computing or harmless), or a derived
tensor no resize can keep entries of (:mod:`fxsym.plugins.hookroles`), could change the
values going into or out of its module and the module's own tensors. The tracer records, for
every call of such a module, the graph nodes of the call's inputs and outputs; the analysis
pins the groups of their dims and of the module's own sizes, each with the reason naming the
hook (:mod:`fxsym.analysis.analyzer`).

Imports from fxsym: nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch.fx
from torch.utils import _pytree as pytree


@dataclass(frozen=True)
class HookSite:
    """One call of module ``path`` whose hooks the trace does not see: ``reasons`` (one per
    hook, naming it) and the names of the graph nodes of its inputs and outputs."""

    path: str
    reasons: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]

    @property
    def reason(self) -> str:
        return "; ".join(self.reasons)


def node_names(value: Any) -> tuple[str, ...]:
    """The names of the graph nodes of the Proxies inside ``value`` (nested containers)."""
    return tuple(leaf.node.name for leaf in pytree.tree_leaves(value)
                 if isinstance(leaf, torch.fx.Proxy))
