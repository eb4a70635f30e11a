"""``model.config`` after blocks of a depth group were dropped (the ``fxsym_after_depth`` hook).

Which config fields describe the stack is found by building the model on the meta device,
never from equal numbers (issue 19 §7):

* the **count**: the int field (``num_hidden_layers``, ``n_layer`` ...) whose value set one
  lower builds the stack one block shorter; it becomes the number of blocks kept;
* **per-layer lists** (``layer_types``): a list of one entry per block, shown to be read per
  block by the build: a config with one more block and the list as it is does not build,
  with the list's last entry repeated it does. It keeps the entries of the kept blocks;
* **lists of block positions** (``mlp_only_layers``): ints below the count whose removal
  changes the blocks the build makes. They keep the kept blocks' new positions.

The result is checked: a model built from the new config on the meta device has as many
blocks, and each block has the string, bool and ``None`` attributes of the block it
replaces (``layer_type``, ``sliding_window`` set or not); where not, the plugin refuses
(:class:`fxsym.ResizeError`, a refusal that leaves the plugin enabled) and the resize is
undone. Per-module sizes the config records for a non-uniform plan
(``config.fxsym_nonuniform``) follow the blocks' new names.

The config is copied, never changed in place (every module holding it gets the copy), and
the config from before fxsym's first resize is kept as for a width resize.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from torch import nn

from fxsym.errors import ResizeError

from .configs import NONUNIFORM, UNPRUNED, meta_build

__all__ = ["update_config_depth"]


def update_config_depth(model: nn.Module, group: Any, kept: Sequence[int]) -> list[str] | None:
    """Give ``model`` a config describing the stack ``group`` once only the blocks ``kept``
    remain; the names of the per-layer fields it followed (``None`` without a config)."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict"):
        return None
    n, k = group.size, len(kept)
    if UNPRUNED not in vars(model):
        vars(model)[UNPRUNED] = copy.deepcopy(config)
    count = _count_field(model, config, group.container, n)
    if count is None:
        raise ResizeError(f"no field of {type(config).__name__} sets the number of blocks of "
                         f"{group.container} (built on the meta device with each int field "
                         f"of value {n} lowered, none gave one block fewer)")
    memo: dict[int, Any] = {}
    new = copy.deepcopy(config, memo)
    setattr(new, count, k)
    followed = [count]
    for field in _per_layer_lists(model, config, count, n):
        setattr(new, field, type(getattr(config, field))(getattr(config, field)[i]
                                                          for i in kept))
        followed.append(field)
    for field in _position_lists(model, config, group.container, n):
        old = set(getattr(config, field))
        setattr(new, field, type(getattr(config, field))(
            j for j, i in enumerate(kept) if i in old))
        followed.append(field)
    nonuniform = getattr(config, NONUNIFORM, None)
    if nonuniform:
        setattr(new, NONUNIFORM, _renamed(nonuniform, group, kept))
    _check(model, new, group)
    for mod in model.modules():
        state = vars(mod)
        for key, value in list(state.items()):
            if id(value) in memo and hasattr(value, "to_dict"):
                state[key] = memo[id(value)]
    return [f for f in followed if f != count]


def _length(model: nn.Module | None, container: str) -> int | None:
    if model is None:
        return None
    try:
        return len(list(model.get_submodule(container).children()))
    except AttributeError:
        return None


def _count_field(model: nn.Module, config: Any, container: str, n: int) -> str | None:
    fields = [f for f, v in vars(config).items()
              if type(v) is int and v == n and not f.startswith("_")]
    for field in fields:
        probe = copy.deepcopy(config)
        setattr(probe, field, n - 1)
        _shorten_lists(probe, n, n - 1)
        if _length(meta_build(model, probe), container) == n - 1:
            return str(field)
    return None


def _shorten_lists(config: Any, n: int, m: int) -> None:
    """Cut (or lengthen, repeating the last entry) every list of ``n`` entries to ``m``: a
    probe changing the count must not fail on a list the class checks against it."""
    for field, value in list(vars(config).items()):
        if isinstance(value, (list, tuple)) and len(value) == n and n:
            items = list(value)[:m] + [value[-1]] * max(0, m - n)
            setattr(config, field, type(value)(items))


def _per_layer_lists(model: nn.Module, config: Any, count: str, n: int) -> list[str]:
    lists = [f for f, v in vars(config).items()
             if isinstance(v, (list, tuple)) and len(v) == n and not f.startswith("_")]
    out = []
    for field in lists:
        longer = copy.deepcopy(config)
        setattr(longer, count, n + 1)
        _shorten_lists(longer, n, n + 1)  # every other list follows the count
        setattr(longer, field, getattr(config, field))
        if meta_build(model, longer) is not None:
            continue  # the build reads no entry per block beyond the list: not per block
        setattr(longer, field, type(getattr(config, field))(
            [*getattr(config, field), getattr(config, field)[-1]]))
        if meta_build(model, longer) is not None:
            out.append(field)
    return out


def _position_lists(model: nn.Module, config: Any, container: str, n: int) -> list[str]:
    base: dict[str, Any] | None = None
    out = []
    for field, value in vars(config).items():
        if field.startswith("_") or not isinstance(value, (list, tuple)) or not value or not all(
                type(i) is int and 0 <= i < n for i in value) or len(value) == n:
            continue
        if base is None:
            base = _signature(meta_build(model, config), container)
        probe = copy.deepcopy(config)
        setattr(probe, field, type(value)())
        if base is not None and _signature(meta_build(model, probe), container) != base:
            out.append(field)
    return out


def _signature(model: nn.Module | None, container: str) -> dict[str, Any] | None:
    if model is None:
        return None
    stack = model.get_submodule(container)
    return {name: tuple(p.shape) for name, p in stack.named_parameters()}


def _check(model: nn.Module, config: Any, group: Any) -> None:
    """A model built from ``config`` has the stack's blocks, each block's string, bool and
    ``None`` attributes those of the block it replaces."""
    built = meta_build(model, config)
    if built is None:
        return  # a class that cannot be built on meta: nothing to compare with
    ours = model.get_submodule(group.container)
    theirs = built.get_submodule(group.container)
    if _length(built, group.container) != _length(model, group.container):
        raise ResizeError(f"the config gives {group.container} {_length(built, group.container)} "
                         f"blocks, the model has {_length(model, group.container)}")
    for j, (mine, other) in enumerate(zip(ours.children(), theirs.children(), strict=True)):
        a, b = _flags(mine), _flags(other)
        if a != b:
            diff = sorted(set(a.items()) ^ set(b.items()), key=str)[0]
            raise ResizeError(f"block {j} of {group.container} built from the new config "
                             f"differs from the block kept there ({diff[0]}): the config "
                             "cannot describe the kept blocks")


def _flags(block: nn.Module) -> dict[str, Any]:
    return {f"{path}.{name}": value for path, mod in block.named_modules()
            for name, value in vars(mod).items()
            if not name.startswith("_") and name != "training"
            and (value is None or type(value) in (str, bool))}


def _renamed(nonuniform: dict[str, dict[str, int]], group: Any,
             kept: Sequence[int]) -> dict[str, dict[str, int]]:
    new_name = {group.blocks[i]: f"{group.container}.{j}" for j, i in enumerate(kept)}
    out: dict[str, dict[str, int]] = {}
    for field, where in nonuniform.items():
        entries: dict[str, int] = {}
        for qualname, size in where.items():
            block = next((b for b in group.blocks if qualname == b or qualname.startswith(
                b + ".")), None)
            if block is None:
                entries[qualname] = size
            elif block in new_name:
                entries[new_name[block] + qualname[len(block):]] = size
        out[field] = entries
    return out
