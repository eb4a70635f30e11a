"""The traced graph made ready for code: names checked, answered questions dropped.

* **Names are data**: torch.fx writes each ``call_module``/``get_attr`` target into its
  generated Python, a part that is not an identifier between double quotes as it is
  (``getattr(self.blocks, "0")``). :func:`_check_code_names` refuses, with a
  :class:`~fxsym.errors.TraceError`, a name that would not read back as itself there (a
  quote, a backslash, a line break: a hostile ``ModuleDict`` key), before any code is
  generated (:func:`_reads_back` parses, never runs).
* :func:`_drop_concretization_checks` removes the placeholders and asserts torch.fx adds for
  arguments fixed to their defaults, and the shape questions answered at trace time
  (comparisons, ``size``, ``dim``, ``len`` of non-tensors) that no node uses.

Imports from fxsym: errors.
"""

from __future__ import annotations

import ast
import functools
import operator

import torch
import torch.fx
from torch.fx._symbolic_trace import _assert_is_none

from ..errors import TraceError


def _check_code_names(graph: torch.fx.Graph) -> None:
    """Refuse a graph with a target that torch.fx's generated code would not name verbatim
    (see the module docstring): generating it would raise ``SyntaxError`` at best and run the
    text of the name at worst."""
    for node in graph.nodes:
        if node.op not in ("call_module", "get_attr", "call_method"):
            continue
        for part in str(node.target).split("."):
            if part.isidentifier() or _reads_back(part):
                continue
            raise TraceError(
                f"the name {part!r} (in {str(node.target)!r}) holds a quote, a backslash or a "
                "control character, which torch.fx would write into its generated Python code "
                "as it is; rename that submodule or attribute (a ModuleDict key, say)")


@functools.lru_cache(maxsize=4096)
def _reads_back(part: str) -> bool:
    """Whether ``"part"`` is a Python string literal whose value is ``part`` (parsed, never
    run: ``ast.literal_eval`` refuses anything but a literal). Remembered: the same names
    (``0``, ``1``, ... of every ``Sequential``) come back in every trace."""
    try:
        return bool(ast.literal_eval(f'"{part}"') == part)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return False


def _drop_concretization_checks(graph: torch.fx.Graph, auto: set[str]) -> None:
    """Remove the placeholders and asserts torch.fx adds for arguments fixed to defaults,
    and the shape questions answered at trace time that nothing in the graph uses."""
    auto_prefixes = tuple(f"{a}_" for a in auto)
    checks = {torch._assert, _assert_is_none}
    answered = {operator.eq, operator.ne, operator.lt, operator.le, operator.gt, operator.ge,
                operator.not_, operator.getitem, getattr, operator.is_, operator.is_not,
                operator.and_, operator.or_, operator.add, operator.sub, operator.mul,
                operator.floordiv, operator.mod, len}
    for node in reversed(list(graph.nodes)):
        if node.users:
            continue
        if node.op == "call_function" and node.target in checks:
            graph.erase_node(node)
        elif node.op == "call_function" and node.target in answered and _not_tensor(node):
            graph.erase_node(node)
        elif node.op == "call_method" and node.target in ("size", "dim", "numel") and _not_tensor(
                node):
            graph.erase_node(node)
        elif node.op == "placeholder" and str(node.target).startswith(auto_prefixes):
            graph.erase_node(node)
    graph.lint()


def _not_tensor(node: torch.fx.Node) -> bool:
    return not isinstance(node.meta.get("val"), torch.Tensor)
