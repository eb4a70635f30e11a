"""Which module classes of a model are attention (or rotary-embedding) modules.

fxsym's registry is keyed by class. Rather than list attention classes family by family, the
hf plugin inspects each model it is asked to trace (:func:`discover`, called from the trace
context): every class with an instance that :func:`.attention.describe` recognizes is
recorded, and the plugin's ``fxsym_register_sym_infos`` hook describes the recorded classes.
When a model brings new classes, the registry is told to collect the plugins' hooks afresh
(``Registry.invalidate``). A registration describes a
class, not a patch: it outlives the trace harmlessly.

Each instance then decides on its own whether it is a leaf (:func:`leaf_policy`): one
attention class may serve as self-attention (a leaf) and as cross-attention (traced through).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from . import rotary
from .attention import describe

#: attention and rotary-embedding classes found so far, and classes known to be neither
ATTENTION_CLASSES: dict[type, None] = {}
ROTARY_CLASSES: dict[type, None] = {}
_NEITHER: set[type] = set()


def discover(model: nn.Module) -> list[type]:
    """Record the attention and rotary classes of ``model``; returns the new ones."""
    new: list[type] = []
    for mod in model.modules():
        cls = type(mod)
        if (cls in ATTENTION_CLASSES or cls in ROTARY_CLASSES or cls in _NEITHER
                or cls.__module__.startswith("torch.")):
            continue
        if describe(mod) is not None:
            ATTENTION_CLASSES[cls] = None
        elif rotary.is_rotary(mod):
            ROTARY_CLASSES[cls] = None
        else:
            _NEITHER.add(cls)
            continue
        new.append(cls)
    if new:
        _reregister()
    return new


def _reregister() -> None:
    """Make fxsym collect the hf plugin's registrations again."""
    from fxsym.registry import get_registry

    get_registry().invalidate()


def leaf_policy(module: nn.Module, qualname: str) -> bool | None:
    """A recognized attention module is a leaf unless a leaf would hide a tie; a rotary
    module is a leaf if its update depends on data."""
    cls = type(module)
    if cls in ATTENTION_CLASSES:
        spec = describe(module)
        return bool(spec is not None and spec.leaf)
    if cls in ROTARY_CLASSES:
        return rotary.data_dependent(module)
    return None


def attention_classes() -> list[Any]:
    return list(ATTENTION_CLASSES)


def rotary_classes() -> list[Any]:
    return list(ROTARY_CLASSES)
