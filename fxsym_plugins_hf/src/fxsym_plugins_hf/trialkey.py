"""What decides a cached-path trial, as a key: the trials of :mod:`.cachepath` already run in
this process are remembered by it and their answer reused.

A trial resizes a copy of the model whose parameters and buffers are meta tensors and runs it:
no value a parameter or buffer holds can change its outcome. What can is, and makes the key:

* the code that runs: every class of the model's modules (with its bases) by identity, and
  each name of its namespace by the identity of what it holds; the Python modules defining
  those classes and the plugins in use, and the modules of this package's and transformers'
  that they name (one step: ``modeling_llama`` names ``masking_utils``, ``cache_utils``...),
  each global by the identity of what it holds (:func:`_globals`): a method or a helper
  patched between two analyses makes another key;
* each module's state: its class; its attributes, numbers, strings, dtypes and containers of
  them by value, a config by its JSON (every field), a function, class or Python module by
  identity, another object by its class and attributes; its parameters' and buffers' names,
  shapes, dtypes and classes; its hooks by identity;
* the analysis the trial resizes by: each group as a whole (name, size, members, step, least
  size, same-size names, ...), the symbol registry by identity and stamp, the analysis options;
* the example inputs' shapes and dtypes, the plugins in use by identity, torch's default dtype.

Every object keyed by identity is held by the memo's entry, so its identity cannot be taken by
another object while the entry lives. Where the state holds what this cannot describe by value
(a tensor that is no parameter or buffer, a module kept outside the module tree, an object
without attributes), there is no key: the trial runs. What the key does not see is state
outside these: a function patched in a module the model's modules do not name, a registry
mutated in place (transformers' attention functions), a torch kernel replaced.
"""

from __future__ import annotations

import enum
import functools
import sys
import types
from collections.abc import Hashable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

#: the top-level packages whose modules the key reads (besides the model classes' own)
_PACKAGES = frozenset({"transformers", "fxsym", "fxsym_plugins_hf", "fxsym_plugins_nn"})
#: how deep the attributes of plain objects are followed
_DEPTH = 6
_PLAIN = (bool, int, str, bytes, type(None))
_IDENTITY = (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type,
             types.MethodDescriptorType, types.WrapperDescriptorType)


class _NoKey(Exception):
    """The state holds something the key cannot describe."""


def trial_key(model: nn.Module, symmap: Any, groups: Sequence[Any], example_inputs: Any,
              plugins: Sequence[Any]) -> tuple[Hashable, list[Any]] | None:
    """The key of a trial of ``model`` (see the module docstring) and the objects it names by
    identity (to hold while the key is remembered); ``None`` where there is none."""
    held: list[Any] = []
    configs: dict[int, Hashable] = {}
    try:
        state = tuple(_module(name, mod, held, configs)
                      for name, mod in model.named_modules(remove_duplicate=False))
        code = _code(model, plugins, held)
        inputs = _plain(dict(example_inputs), held, configs, 0, inputs=True)
        options = _plain(getattr(symmap, "analysis_options", None), held, configs, 0)
    except _NoKey:
        return None
    registry = symmap.registry
    held += [registry, *plugins]
    key = (state, code, inputs, options, repr(list(groups)), id(registry), registry.stamp,
           tuple(id(p) for p in plugins), str(torch.get_default_dtype()))
    return key, held


def _module(name: str, mod: nn.Module, held: list[Any], configs: dict[int, Hashable]
            ) -> Hashable:
    tensors = tuple((kind, n, None if t is None else (id(type(t)), tuple(t.shape), str(t.dtype),
                                                      bool(t.requires_grad)))
                    for kind, table in (("p", mod._parameters), ("b", mod._buffers))
                    for n, t in table.items())
    held.append(type(mod))
    attrs = tuple((k, _plain(v, held, configs, 0)) for k, v in vars(mod).items()
                  if k not in ("_parameters", "_buffers", "_modules"))
    return name, id(type(mod)), tuple(mod._modules), tensors, attrs


def _plain(value: Any, held: list[Any], configs: dict[int, Hashable], depth: int, *,
           inputs: bool = False) -> Hashable:
    """``value`` as a hashable description (see the module docstring); :class:`_NoKey`
    where it cannot be described."""
    if depth > _DEPTH:
        raise _NoKey
    kind = type(value).__name__
    if isinstance(value, _PLAIN):
        return kind, value
    if isinstance(value, float):
        return kind, repr(value)
    if isinstance(value, (torch.dtype, torch.device, torch.Size)):
        return kind, str(value)
    if isinstance(value, torch.Tensor):
        if inputs and not isinstance(value, nn.Parameter):  # an example input: its shape
            return kind, tuple(value.shape), str(value.dtype)
        raise _NoKey
    if isinstance(value, nn.Module):
        raise _NoKey  # a module outside the module tree
    if isinstance(value, enum.Enum):
        held.append(type(value))
        return "enum", id(type(value)), value.name
    if isinstance(value, (tuple, list)):
        return kind, tuple(_plain(v, held, configs, depth + 1, inputs=inputs) for v in value)
    if isinstance(value, Mapping):
        return kind, tuple((_plain(k, held, configs, depth + 1),
                            _plain(v, held, configs, depth + 1, inputs=inputs))
                           for k, v in value.items())
    if isinstance(value, (set, frozenset)):
        return kind, tuple(sorted((_plain(v, held, configs, depth + 1) for v in value),
                                  key=repr))
    if isinstance(value, _IDENTITY):
        held.append(value)
        return "id", id(value)
    if isinstance(value, types.MethodType):
        held += [value.__func__, value.__self__]
        return "method", id(value.__func__), id(value.__self__)
    if isinstance(value, functools.partial):
        held.append(value.func)
        return ("partial", id(value.func), _plain(value.args, held, configs, depth + 1),
                _plain(value.keywords, held, configs, depth + 1))
    to_json = getattr(value, "to_json_string", None)
    if callable(to_json) and hasattr(value, "to_dict"):  # a config: every field
        if id(value) not in configs:
            try:
                configs[id(value)] = (id(type(value)), to_json(use_diff=False))
            except Exception as exc:  # a config that cannot say its fields
                raise _NoKey from exc
            held += [value, type(value)]
        return "config", configs[id(value)]
    attrs = getattr(value, "__dict__", None)
    if not isinstance(attrs, dict) or hasattr(type(value), "__slots__"):
        raise _NoKey
    held.append(type(value))
    return "object", id(type(value)), _plain(attrs, held, configs, depth + 1)


def _code(model: nn.Module, plugins: Sequence[Any], held: list[Any]) -> Hashable:
    """The classes of ``model``'s modules and the Python modules the trial's code lives in,
    each name by the identity of what it holds."""
    classes: dict[int, type] = {}
    for mod in model.modules():
        for cls in type(mod).__mro__:
            if cls is not object:
                classes.setdefault(id(cls), cls)
    for plugin in plugins:
        for cls in type(plugin).__mro__:
            if cls is not object:
                classes.setdefault(id(cls), cls)
    packages = _PACKAGES | {c.__module__.partition(".")[0] for c in classes.values()}
    packages -= {"torch", "builtins"}
    names = {c.__module__ for c in classes.values()}
    for name in list(names):  # one step: the modules they name
        found = sys.modules.get(name)
        for v in vars(found).values() if found is not None else ():
            other = v.__name__ if isinstance(v, types.ModuleType) else getattr(
                v, "__module__", None)
            if isinstance(other, str) and other.partition(".")[0] in packages:
                names.add(other)
    out: list[Hashable] = []
    for cls in classes.values():
        held.append(cls)
        held.extend(vars(cls).values())
        out.append((id(cls), tuple((k, id(v)) for k, v in vars(cls).items())))
    for name in sorted(names):
        found = sys.modules.get(name)
        if found is None or name.partition(".")[0] not in packages:
            continue
        space = _globals(found)
        held.append(found)
        held.extend(space.values())
        out.append((name, tuple((k, id(v)) for k, v in space.items())))
    return tuple(out)


def _globals(module: types.ModuleType) -> dict[str, Any]:
    """The names of ``module`` that its code reads: its globals and, for a package that
    resolves names lazily (a module ``__getattr__``), every name of ``__all__`` resolved, so
    that a name first read by the first analysis is no other key; no dunder name
    (``__warningregistry__`` comes with a first warning), no submodule (a package gains it
    when it is first imported)."""
    space = dict(vars(module))
    if "__getattr__" in space:
        for name in space.get("__all__", ()):
            if isinstance(name, str) and name not in space:
                try:
                    space[name] = getattr(module, name)
                except Exception:  # a lazy name that cannot be resolved: left out
                    continue
    return {k: v for k, v in space.items()
            if not (k.startswith("__") and k.endswith("__")) and not isinstance(
                v, types.ModuleType)}
