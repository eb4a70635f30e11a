"""Which module classes the hf plugin describes, decided by the class alone.

**Attention.** A module that *looks* like attention (query/key/value projections, a
``hidden_states`` argument, a head count) may still mix its heads: roll them, sum them, run a
linear map across them. A leaf hides that from fxsym, so the plugin makes a leaf only of
modules whose ``forward`` it knows (:func:`known_attention`): a ``forward`` defined by
transformers itself that hands its per-head queries, keys and values to transformers' shared
attention interface (``ALL_ATTENTION_FUNCTIONS``, with ``eager_attention_forward`` as the
default). That is the convention of every transformers attention module: project, view as
``(..., heads, head_dim)``, attend each head on its own, concatenate, project out. A subclass
keeps the verdict only if it keeps that ``forward``. Any other module, however attention-like,
is traced through: fxsym's op rules then derive from the graph what its heads may do (a
subclass overriding a known class's ``forward`` is named in the trace report as
``traced-into`` by fxsym's registry).

**Rotary embeddings.** A class whose ``forward`` takes ``(x, position_ids)``; each instance
then decides (:mod:`.rotary`).

**History.** fxsym's registry is keyed by class, so the plugin registers the classes it
describes. Whether a class is registered is a pure function of the class (cached by class), and
:meth:`Known.discover` records every such class in the MRO of a model's modules before that
model is traced. So everything that decides a model's groups depends on that model alone, not
on which models were analyzed before; classes registered for earlier models are never
consulted for modules that are not of (or derived from) them. The record is per plugin
instance, so per plugin manager.

Each instance then decides on its own whether it is a leaf (:func:`leaf_policy`): one attention
class may serve as self-attention (a leaf) and as cross-attention (traced through).
"""

from __future__ import annotations

import dis
import functools
import inspect
from typing import Any

from torch import nn

from . import rotary
from .attention import describe

#: global names whose use in ``forward`` shows the shared per-head attention interface
ATTENTION_INTERFACE = "ALL_ATTENTION_FUNCTIONS"


def _forward(cls: type) -> Any:
    return inspect.unwrap(getattr(cls, "forward", None) or (lambda: None))


@functools.cache
def known_attention(cls: type) -> bool:
    """Whether ``cls``'s ``forward`` is a transformers attention ``forward`` that attends each
    head on its own through the shared attention interface (a pure function of the class)."""
    forward = _forward(cls)
    code = getattr(forward, "__code__", None)
    if code is None or not str(getattr(forward, "__module__", "")).startswith("transformers."):
        return False
    names = {ins.argval for ins in dis.get_instructions(code)
             if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    return ATTENTION_INTERFACE in names


@functools.cache
def known_rotary(cls: type) -> bool:
    """Whether ``cls`` has a rotary embedding's ``forward(x, position_ids, ...)``."""
    return rotary.rotary_forward(cls)


class Known:
    """The classes one plugin instance (so one plugin manager) has found in the models it
    saw: attention, rotary and activation classes. Membership is a pure function of the class
    (:func:`known_attention`, :func:`known_rotary`, :func:`known_activation`): this is a
    cache, not a history."""

    def __init__(self) -> None:
        self.attention: dict[type, None] = {}
        self.rotary: dict[type, None] = {}
        self.activations: dict[type, None] = {}

    def add(self, cls: type) -> bool:
        """Record ``cls`` if the plugin describes it; whether it was new."""
        if cls in self.attention or cls in self.rotary or cls in self.activations:
            return False
        if known_attention(cls):
            self.attention[cls] = None
        elif known_rotary(cls):
            self.rotary[cls] = None
        elif known_activation(cls):
            self.activations[cls] = None
        else:
            return False
        return True

    def discover(self, model: nn.Module) -> list[type]:
        """Record the classes the plugin describes in the MRO of ``model``'s modules; returns
        the ones new to this instance."""
        new: list[type] = []
        for cls in {type(mod): None for mod in model.modules()}:
            for base in cls.__mro__:
                if base is nn.Module:
                    break
                if not base.__module__.startswith("torch.") and self.add(base):
                    new.append(base)
        return new


@functools.cache
def known_activation(cls: type) -> bool:
    """Whether ``cls`` is one of transformers' own activation modules (``ACT2CLS``; torch.nn
    ones are the nn plugin's)."""
    if not cls.__module__.startswith("transformers."):
        return False
    from transformers.activations import ACT2CLS

    for entry in ACT2CLS.values():
        if (entry[0] if isinstance(entry, tuple) else entry) is cls:
            return True
    return False


def leaf_policy(module: nn.Module, qualname: str) -> bool | None:
    """A known attention module is a leaf unless a leaf would hide a tie; a rotary module is
    a leaf if its update depends on data. Anything else is not this plugin's to decide."""
    cls: type = type(module)
    if known_attention(cls):
        spec = describe(module)
        return bool(spec is not None and spec.leaf)
    if known_rotary(cls) and rotary.is_rotary(module):
        return rotary.data_dependent(module)
    return None
