"""Copies of one module for trial runs of its resize rule: made as ``copy.deepcopy`` makes them,
faster for what a module mostly holds (``_copy_module``), with the model's tensors mapped to
meta stand-ins and the copy's state kept to be put back after each trial (``_clone_of``).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, cast

from torch import nn

from ..modstate import ModuleTreeState


def _clone_of(mod: nn.Module, memo_base: Mapping[int, Any]
              ) -> tuple[nn.Module, ModuleTreeState]:
    """``copy.deepcopy(mod, memo)`` (``memo_base`` maps the model's tensors to their meta
    stand-ins), and the copy's state to put back after each trial."""
    clone = _copy_module(mod, dict(memo_base))
    return clone, ModuleTreeState(clone)


_ATOMS = frozenset({int, float, str, bool, type(None)})
_EMPTY = frozenset({dict, OrderedDict, list, set})
_OWN_COPY = ("__deepcopy__", "__getnewargs_ex__", "__getnewargs__")


def _copy_module(mod: nn.Module, memo: dict[int, Any]) -> nn.Module:
    """What ``copy.deepcopy(mod, memo)`` gives, made the way it makes it for an object copied
    by ``object.__reduce_ex__`` (a new object of its class, ``__setstate__`` of a deep copy of
    its ``__getstate__``), without its generic machinery for what a module mostly holds:
    values that are their own copies (numbers, strings, tuples of them), empty containers
    (the hook tables), tensors the memo maps, submodules (copied here, recursively). A module
    whose class copies itself another way, and every other value, go through
    ``copy.deepcopy`` with the same memo."""
    done = memo.get(id(mod))
    if done is not None:
        return done  # type: ignore[no-any-return]
    cls = type(mod)
    state = cast(Any, mod).__getstate__() if cls.__reduce_ex__ is object.__reduce_ex__ and \
        cls.__reduce__ is object.__reduce__ and not isinstance(mod, (list, dict)) and \
        not any(hasattr(cls, a) for a in _OWN_COPY) else None
    if not isinstance(state, dict):
        return copy.deepcopy(mod, memo)
    new = cls.__new__(cls)
    memo[id(mod)] = new
    copied: dict[str, Any] = {}
    for key, value in state.items():
        kind = type(value)
        if kind in _ATOMS or (kind is tuple and all(type(v) in _ATOMS for v in value)):
            copied[key] = value
        elif kind in _EMPTY and not value:
            made = memo.get(id(value))
            if made is None:
                made = memo[id(value)] = kind()
            copied[key] = made
        elif key in ("_parameters", "_buffers", "_modules") and kind is dict:
            one = _copy_module if key == "_modules" else copy.deepcopy
            copied[key] = {k: None if v is None else one(v, memo) for k, v in value.items()}
        else:
            copied[key] = copy.deepcopy(value, memo)
    if hasattr(new, "__setstate__"):
        cast(Any, new).__setstate__(copied)
    else:
        vars(new).update(copied)
    return new
