"""What a module's forward hook is to the program: the typed answers plugins give about hooks.

A forward hook or pre-hook registered on a module is part of the program the model runs, but
a trace does not run every hook (a leaf's hooks never run in the graph; the user's are left
out of the shadow tree, since running them could write into the user's objects). So each hook
is one of:

* *computes* (``fxsym_hook_computes`` answers ``True``): it runs while the model is traced,
  on the traced values, so its effect is in the graph (a leaf holding one is traced into);
* *observes* (``fxsym_hook_computes`` answers ``False``): it changes no value the model
  computes; it does not run while traced, and nothing is pinned for it;
* *derives tensors* (``fxsym_derived_tensors`` answers a :class:`DerivedTensors`): a
  forward pre-hook that recomputes tensors of its module from others before every forward
  (``torch.nn.utils.weight_norm``: ``weight`` from ``weight_g`` and ``weight_v``). The
  module's family describes and resizes ``weight`` as usual; a resize keeps entries of it by
  resizing its sources (:attr:`DerivedTensors.keep`). Without a ``keep``, the groups of the
  module are pinned, with :attr:`DerivedTensors.reason` in the trace report;
* *unknown* (nobody answers): it does not run while traced and its effect is not seen, so the
  groups of the values it could change (the module call's inputs and outputs) and the
  module's own sizes are pinned, and a ``hidden-hook`` report line names it.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: ``keep(module, hook, name, dim, index)``: keep the entries ``index`` along ``dim`` of the
#: tensor ``name`` that ``hook`` computes, by binding new sources (never writing the old ones)
#: and the recomputed tensor
DerivedKeep = Callable[[nn.Module, Any, str, int, torch.Tensor], None]


@dataclass(frozen=True)
class DerivedTensors:
    """A forward pre-hook computing tensors of its module from others before every forward.

    ``names``: the module attributes it sets (``("weight",)``); ``sources``: the parameters
    and buffers it computes them from; ``keep``: how a resize keeps entries of one of
    ``names`` (``None``: it cannot, and the module's groups are pinned); ``reason``: what the
    report says of it (why a resize cannot keep entries, when ``keep`` is ``None``).
    """

    names: tuple[str, ...]
    sources: tuple[str, ...]
    keep: DerivedKeep | None = None
    reason: str = ""


def describe_hook(hook: Any) -> str:
    """How a report names a hook: ``module.qualname`` of a function (with the file line of a
    lambda), the class of a callable object, the function of a ``functools.partial``."""
    while isinstance(hook, functools.partial):
        hook = hook.func
    name = getattr(hook, "__qualname__", None) or getattr(hook, "__name__", None)
    if not isinstance(name, str):
        cls = type(hook)
        return f"{cls.__module__}.{cls.__qualname__} object"
    mod = getattr(hook, "__module__", None)
    text = f"{mod}.{name}" if isinstance(mod, str) else name
    code = getattr(hook, "__code__", None)
    if "<lambda>" in name and code is not None:
        text += f" ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})"
    return text
