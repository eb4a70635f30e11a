"""Values remembered by what they depend on: a key, and the value given again for it.

Running torch's meta kernels is most of a trace's cost, and a model repeats itself: every
block calls the same torch.nn leaves and torch functions on inputs of the same metadata.
:mod:`.nodevalues` therefore keys each such call by everything its value's metadata depends
on, and a second call with an equal key gets a fresh copy of the first one's value instead
of running:

* :func:`_module_key` — a torch.nn module whose forward reads nothing but its plain attributes
  (ints, floats, strings, tuples of them), its tensors' metadata and its submodules, with no
  hook (``None`` for anything else: it is run);
* :func:`_op_key` — a torch function or ``Tensor`` method (not in place) on meta tensors;
* :func:`_plain_key` — arguments: plain values with their types (``2`` and ``2.0`` differ),
  tensors by metadata; :func:`_global_key` the process state a forward may read (default
  dtype, grad, autocast);
* :func:`_recorded` / :func:`_fresh_copy` — a value as shapes, strides and dtypes (a view of a
  tensor made inside the call as that tensor and the view's geometry, an input given back as
  its position) and a new value like it, sharing no tensor with it; a value holding anything
  else (a view of an input, a tensor subclass) is not remembered.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from typing import Any

import torch
import torch.fx
from torch import nn

from .meta import _META, _SCALARS, _tensor_kinds

#: operators whose result on tensors is a new tensor computed from their metadata alone
_PURE_OPERATORS = frozenset({operator.add, operator.sub, operator.mul, operator.truediv,
                             operator.matmul, operator.neg})
#: modules of torch's own functions (``torch.relu``, ``F.adaptive_avg_pool2d``, ...)
_TORCH_MODULES = frozenset({"torch", "torch.nn.functional", "torch._C._nn",
                            "torch._C._VariableFunctions", "torch.functional"})


def _op_key(op: str, target: Any, args: Any, kwargs: Any) -> Any:
    """What the value of a torch function or ``Tensor`` method on meta tensors depends on,
    like :meth:`FxsymTracer._leaf_key`; ``None`` for anything else (in-place ops, other
    functions, no meta tensor among the arguments)."""
    if op == "call_method":
        if (not isinstance(target, str) or target.endswith("_") or not args
                or type(args[0]) is not torch.Tensor or not args[0].is_meta):
            return None
    elif target not in _PURE_OPERATORS:
        name = getattr(target, "__name__", "")
        if (getattr(target, "__module__", None) not in _TORCH_MODULES or name.endswith("_")
                or name.startswith("_")):
            return None
        if not _tensor_kinds((args, kwargs)) & _META:
            return None
    inputs = _plain_key((args, kwargs))
    return None if inputs is None else (op, target, inputs, _global_key())


#: hook tables and the like: a module holding anything in them is not keyed
_TABLES = frozenset({"_parameters", "_buffers", "_modules"})


def _module_key(mod: nn.Module) -> Any:
    """A key that determines the metadata of what ``mod``'s forward returns on given inputs,
    or ``None``. Only modules of torch.nn itself (their forward reads nothing but their
    attributes, tensors and submodules), whose attributes are all plain values (ints,
    floats, strings, tuples and lists of them, ...) and whose hook tables are empty."""
    cls = type(mod)
    if not cls.__module__.startswith("torch.nn."):
        return None
    parts: list[Any] = [cls]
    for name, value in vars(mod).items():
        if name in _TABLES:
            continue
        if type(value) in _HOOK_TABLES:
            if value:
                return None
            continue
        plain = _plain_key(value)
        if plain is None:
            return None
        parts.append((name, plain))
    for name, tensor in (*mod._parameters.items(), *mod._buffers.items()):
        parts.append((name, None if tensor is None else _tensor_key(tensor)))
    for name, child in mod._modules.items():
        sub = None if child is None else _module_key(child)
        if child is not None and sub is None:
            return None
        parts.append((name, sub))
    return tuple(parts)


#: the types of a module's hook tables (``OrderedDict``) and its set of non-persistent
#: buffer names
_HOOK_TABLES = frozenset({OrderedDict, set, dict})


def _tensor_key(t: torch.Tensor) -> Any:
    return (type(t), tuple(t.shape), t.stride(), t.dtype, t.device, t.storage_offset(),
            t.requires_grad)


_SEQUENCES = frozenset({tuple, list, torch.Size, torch.fx.immutable_collections.immutable_list})
_MAPPINGS = frozenset({dict, torch.fx.immutable_collections.immutable_dict})


def _plain_key(value: Any) -> Any:
    """A hashable key equal for equal plain values (with their types, so ``2`` and ``2.0``
    differ), tensors by metadata; ``None`` if ``value`` holds anything else."""
    kind = type(value)
    if kind in _SCALARS:
        return (kind, value)
    if isinstance(value, torch.Tensor):
        return _tensor_key(value)
    if kind in _SEQUENCES:
        items = [_plain_key(v) for v in value]
        return None if any(i is None for i in items) else (kind, tuple(items))
    if kind in _MAPPINGS:
        pairs = [(k, _plain_key(v)) for k, v in value.items()]
        if any(type(k) is not str or v is None for k, v in pairs):
            return None
        return (kind, tuple(pairs))
    return None


def _global_key() -> Any:
    """The process state a torch.nn forward may read: default dtype, grad and autocast."""
    return (torch.get_default_dtype(), torch.is_grad_enabled(),
            torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu"))


def _recorded(value: Any, args: tuple[Any, ...]) -> Any:
    """How to give ``value`` again for other inputs with the same key: its tensors as
    ``(shape, stride, dtype)``, a view of a tensor made inside the module as that tensor and
    the view's geometry, an input given back as its position; ``None`` if it holds anything
    else (a view of an input, a tensor not of plain type)."""
    if isinstance(value, torch.Tensor):
        for i, a in enumerate(args):
            if value is a:
                return ("arg", i)
        if type(value) is not torch.Tensor or not value.is_meta or value.requires_grad:
            return None
        base = value._base
        if base is None:
            if value.storage_offset() != 0:
                return None
            return ("tensor", tuple(value.shape), value.stride(), value.dtype)
        if any(base is a or base is getattr(a, "_base", None) for a in args):
            return None  # a view of an input
        whole = _recorded(base, ())
        if whole is None or whole[0] != "tensor":
            return None
        return ("view", whole, tuple(value.shape), value.stride(), value.storage_offset())
    if type(value) is tuple:
        items = [_recorded(v, args) for v in value]
        return None if any(i is None for i in items) else ("tuple", tuple(items))
    if value is None:
        return ("none",)
    return None


def _fresh_copy(recorded: Any, args: tuple[Any, ...]) -> Any:
    """A value like the one :func:`_recorded` described, sharing no tensor with it."""
    kind = recorded[0]
    if kind == "tensor":
        return torch.empty_strided(recorded[1], recorded[2], dtype=recorded[3], device="meta")
    if kind == "view":  # of a tensor made inside the module, as a fresh one
        return _fresh_copy(recorded[1], args).as_strided(recorded[2], recorded[3], recorded[4])
    if kind == "arg":
        return args[recorded[1]]
    if kind == "tuple":
        return tuple(_fresh_copy(r, args) for r in recorded[1])
    return None
