"""A working copy of a GraphModule that shares tensors but no structure with the original.

``optimize`` must leave the user's model (and a GraphModule passed in) untouched, yet
copying every weight would be wasteful. The copy built here has its own graph and its own
module objects — every submodule shallow-copied, with fresh ``_modules``/``_parameters``/
``_buffers`` dictionaries — while tensors are shared. Passes only ever *replace* tensors and
modules (never write into them), so nothing they do reaches the original. Aliasing inside
the model (one module reachable under two names) is preserved.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import fx, nn

_COPIED_ATTRS = ("trace_report",)


def _clone_tree(module: nn.Module, memo: dict[int, nn.Module]) -> nn.Module:
    found = memo.get(id(module))
    if found is not None:
        return found
    clone = copy.copy(module)
    memo[id(module)] = clone
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    if hasattr(module, "_non_persistent_buffers_set"):
        clone._non_persistent_buffers_set = set(module._non_persistent_buffers_set)
    clone._modules = {
        k: (_clone_tree(v, memo) if v is not None else None) for k, v in module._modules.items()
    }
    return clone


def working_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A GraphModule computing the same thing as ``gm``, safe to rewrite (see module doc)."""
    new = fx.GraphModule(gm, copy.deepcopy(gm.graph), class_name=type(gm).__name__)
    memo: dict[int, nn.Module] = {}
    new._modules = {
        k: (_clone_tree(v, memo) if v is not None else None) for k, v in new._modules.items()
    }
    new.meta = dict(getattr(gm, "meta", {}) or {})
    for attr in _COPIED_ATTRS:
        value: Any = getattr(gm, attr, None)
        if value is not None:
            setattr(new, attr, value)
    return new
