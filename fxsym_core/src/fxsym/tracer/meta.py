"""Tensors on the meta device: what the tracer computes values with.

With example inputs, every node's value is computed on the ``meta`` device when the node is
created (:mod:`.nodevalues`): shapes, dtypes and strides, never data. Three pieces serve that:

* :func:`to_meta` moves a value's tensors there (a parameter becomes a plain tensor, detached);
* :func:`meta_copy` is the copy of a leaf module that is run for its value: its parameters and
  buffers are meta tensors and its attribute containers its own, so running it (or a resize
  rule on it) leaves the user's module as it was; not ``copy.copy``, which parametrized
  modules refuse;
* :func:`_tensor_kinds` says which kinds of tensors a value holds (meta, real, requiring grad,
  0-dim CPU numbers, which torch lets meet meta tensors), so a value already on the meta
  device is not copied again and one a real factory made is moved where it meets meta ones.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any

import torch
import torch.fx
from torch import nn
from torch.utils import _pytree as pytree


def to_meta(value: Any) -> Any:
    """``value`` with every tensor moved to the meta device (parameters become plain tensors)."""
    if isinstance(value, torch.Tensor):
        return _tensor_to_meta(value)
    return pytree.tree_map(_tensor_to_meta, value)


def _tensor_to_meta(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        t = x.detach() if x.requires_grad else x
        return t if t.is_meta else t.to("meta")
    return x


#: what :func:`_tensor_kinds` finds: meta tensors, other tensors, tensors requiring grad, and
#: 0-dim tensors on the CPU not requiring grad (numbers, which torch lets meet meta tensors)
_META, _REAL, _GRAD, _NUMBER = 1, 2, 4, 8
_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device})


def _tensor_kinds(value: Any) -> int:
    """The kinds of tensors inside ``value`` (or-ed :data:`_META`, :data:`_REAL`,
    :data:`_GRAD`), walking tuples, lists and dicts directly and anything else that pytree
    opens through pytree. Every tensor pytree reaches is reached, so "no ``_REAL``" means
    :func:`to_meta` would change nothing."""
    kind = type(value)
    if kind in _SCALARS:
        return 0
    if isinstance(value, torch.Tensor):
        if value.requires_grad:
            return _GRAD | (_META if value.is_meta else _REAL)
        if value.is_meta:
            return _META
        return _NUMBER if value.dim() == 0 and value.device.type == "cpu" else _REAL
    found = 0
    if isinstance(value, (tuple, list)):
        for item in value:
            found |= _tensor_kinds(item)
    elif isinstance(value, dict):
        for item in value.values():
            found |= _tensor_kinds(item)
    elif not pytree.tree_is_leaf(value):
        for item in pytree.tree_leaves(value):
            found |= _tensor_kinds(item)
    return found


#: containers whose ``copy()`` is ``copy.copy`` (without its ``__reduce_ex__`` detour)
_PLAIN_CONTAINERS = frozenset({dict, list, set, OrderedDict})


def meta_copy(mod: nn.Module) -> nn.Module:
    """A copy of ``mod`` and its submodules whose parameters and buffers are meta tensors
    (parameters stay ``Parameter``s) and whose attribute containers are copies: running it, or
    a resize rule on it, leaves ``mod`` as it was. Not ``copy.copy``: parametrized modules
    refuse it."""
    clone = object.__new__(type(mod))
    state = vars(clone)
    for key, value in vars(mod).items():
        if type(value) in _PLAIN_CONTAINERS:
            value = value.copy()
        elif isinstance(value, (list, dict, set)):
            value = copy.copy(value)
        state[key] = value
    state["_parameters"] = {
        k: None if v is None else nn.Parameter(to_meta(v), requires_grad=False)
        for k, v in mod._parameters.items()}
    state["_buffers"] = {k: None if v is None else to_meta(v) for k, v in mod._buffers.items()}
    state["_modules"] = {k: None if v is None else meta_copy(v) for k, v in mod._modules.items()}
    return clone
