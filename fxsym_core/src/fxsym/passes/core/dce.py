"""Dead-code elimination that keeps every effect.

A node with no users is erased when erasing it cannot be observed: it is not a placeholder or
the output, :meth:`torch.fx.Node.is_impure` says it has no side effect (this covers random
ops), it writes into none of its arguments (torch.fx treats ``x.add_(1)`` as pure; we do
not), and — for a module call — the module is in eval mode or has no buffers a forward could
update (a BatchNorm in training mode updates its running statistics).

Erasing runs in reverse graph order, so a chain of dead nodes goes in one sweep.
"""

from __future__ import annotations

from torch import fx

from ..ops import Modules, mutated_arg


def _removable(node: fx.Node, modules: Modules) -> bool:
    if node.op in ("placeholder", "output") or node.users:
        return False
    if node.op == "get_attr":
        return True
    if node.is_impure() or mutated_arg(node, modules) is not None:
        return False
    if node.op == "call_module":
        module = modules.get(node.target)
        if module.training and any(True for _ in module.buffers()):
            return False
    return True


def dead_code_elimination(gm: fx.GraphModule) -> int:
    """Erase unused nodes that have no effect."""
    modules = Modules(gm)
    removed = 0
    for node in reversed(list(gm.graph.nodes)):
        if _removable(node, modules):
            gm.graph.erase_node(node)
            removed += 1
    return removed
