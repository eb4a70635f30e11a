"""The GraphModule of a trace, built around the user's modules.

torch.fx builds a ``GraphModule`` by copying each ``call_module``/``get_attr`` target out of
the traced root with ``getattr``/``setattr``. A trace runs a shadow of the model
(:mod:`.shadow`), which lives for one trace, and the GraphModule must hold the user's modules
(decisions by identity, a resize and the user see those), so :func:`_graph_module` builds it
itself from :func:`_held`: the object at each target, the user's module for a ``call_module``
target, the user's value for an attribute the forward rebound to a traced value. It keeps
torch.fx's rules (targets in the order the graph first names them, plain ``nn.Module``
intermediates, a tensor that is not a parameter is a buffer as persistent as where it came
from) with plain dict operations, which cost a tenth of what torch.fx's walk does.

Imports from fxsym: nothing.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.fx
from torch import nn

from .shadow import ShadowTree


def _graph_module(cls: type[torch.fx.GraphModule], graph: torch.fx.Graph, class_name: str,
                  shadows: ShadowTree) -> torch.fx.GraphModule:
    """What ``cls(shadows.root, graph, class_name)`` builds, holding the user's module at each
    ``call_module`` target (see :func:`_held`), built with plain dict operations: torch.fx
    copies each target by walking both trees with ``getattr`` and ``setattr``, whose lookups of
    missing names raise inside ``nn.Module.__getattr__`` and whose ``isinstance`` checks go
    through ``Parameter``'s metaclass (about a tenth of a CNN's trace).

    As torch.fx does, targets are installed in the order the graph first names them, each
    under plain ``nn.Module`` intermediates, a target inside one installed already is not
    installed again (an intermediate is replaced where a target names it), and a tensor that
    is not a parameter is a buffer, persistent as it was where it came from. A module called
    inside a target installed already (a shadow the GraphModule holds) is put there too."""
    shell = torch.fx.Graph(tracer_cls=graph._tracer_cls, tracer_extras=graph._tracer_extras)
    gm = cls({}, shell, class_name)
    gm.training = shadows.root.training
    built: dict[str, nn.Module] = {"": gm}  # the intermediates, and the root
    installed: set[str] = set()
    for target, (value, owner) in _held(graph, shadows).items():
        parent_path, _, field = target.rpartition(".")
        if _inside(parent_path, installed):
            parent = gm.get_submodule(parent_path)
            held = parent._modules.get(field)
            if isinstance(value, nn.Module) and held is not value and shadows.original(
                    held) is value:
                parent._modules[field] = value  # a module called there: the user's
            continue
        to_module = _intermediate(built, parent_path)
        if type(value) is not nn.Parameter and isinstance(value, torch.Tensor) and (
                not isinstance(value, nn.Parameter)):
            to_module.register_buffer(
                field, value, persistent=field not in owner._non_persistent_buffers_set)
        elif _free_name(to_module, field) and isinstance(value, nn.Module):
            to_module._modules[field] = value  # what setattr does for a name not held
        elif _free_name(to_module, field) and type(value) is nn.Parameter:
            to_module._parameters[field] = value
        else:
            setattr(to_module, field, value)
        built.pop(target, None)  # an intermediate replaced: nothing more goes into it
        installed.add(target)
    gm.graph = graph
    return gm


def _held(graph: torch.fx.Graph, shadows: ShadowTree) -> dict[str, tuple[Any, nn.Module]]:
    """By ``call_module``/``get_attr`` target, in the order the graph first names them: the
    object the GraphModule holds there and the module of the traced tree it is read from.
    That object is the one at that path of the traced (shadow) tree, but for a
    ``call_module`` target, which is the user's module (decisions by identity, a resize and
    the user see the user's modules; a shadow lives for one trace), and for an attribute the
    forward rebound to a traced value (Swin's ``self.window_size = ...``), which is the
    user's value, the one the trace read."""
    found = dict(shadows.paths)
    held: dict[str, tuple[Any, nn.Module]] = {}
    calls: set[str] = set()
    for node in graph.nodes:
        op = node.op
        if op == "call_module" or op == "get_attr":
            target = str(node.target)
            if op == "call_module":
                calls.add(target)
            if target not in held:
                parent_path, _, field = target.rpartition(".")
                owner = _attribute_at(found, parent_path)
                value = found.get(target)
                if value is None:
                    value = getattr(owner, field)
                    if isinstance(value, torch.fx.Proxy):  # a size the forward rebound
                        value = getattr(shadows.original(owner), field)
                held[target] = (value, owner)
    for target in calls:
        value, owner = held[target]
        held[target] = (shadows.original(value), owner)
    return held


def _attribute_at(found: dict[str, Any], path: str) -> Any:
    """The object at ``path`` below ``found[""]``, remembered in ``found`` with the objects
    on the way."""
    obj = found.get(path)
    if obj is None:
        parent_path, _, name = path.rpartition(".")
        obj = found[path] = getattr(_attribute_at(found, parent_path), name)
    return obj


def _free_name(mod: nn.Module, name: str) -> bool:
    """Whether ``mod`` holds nothing named ``name`` (``setattr`` then only adds it)."""
    return not (name in vars(mod) or name in mod._modules or name in mod._parameters
                or name in mod._buffers or hasattr(type(mod), name))


def _inside(path: str, installed: set[str]) -> bool:
    """Whether ``path`` or a path above it is in ``installed``."""
    while path:
        if path in installed:
            return True
        path = path.rpartition(".")[0]
    return False


def _intermediate(built: dict[str, nn.Module], path: str) -> nn.Module:
    """The module at ``path`` of the GraphModule ``built[""]`` being built, a plain
    ``nn.Module`` created (with its parents) where none is yet."""
    mod = built.get(path)
    if mod is None:
        parent_path, _, name = path.rpartition(".")
        parent = _intermediate(built, parent_path)
        mod = built[path] = nn.Module()
        if _free_name(parent, name):
            parent._modules[name] = mod
        else:
            setattr(parent, name, mod)
    return mod
