"""A diffusers model's ``config`` after :func:`fxsym.resize` (the ``fxsym_after_resize`` hook).

diffusers builds a model from its config (``from_pretrained``, ``from_config``), whose fields
are the constructor's arguments: ints (``norm_num_groups``, ``cross_attention_dim``) and
tuples of ints, one per block (``block_out_channels``). After a resize the config must
describe the resized model, or say that it cannot.

Which field sizes what is found, never named nor guessed from equal numbers (issue 19 §7):
a field whose value was the length of a dim the resize changed, or each such int of a tuple
field, is set to twice its value in a config the model's class is built from on the meta
device; the parameter and buffer dims, and the int module attributes the model computes with
(those its traced ``forward`` reads and those its leaves' SymInfos declare: a GroupNorm's
``num_groups``), that double with it are the field's. Where all of them hold one value in the
resized model, the field takes it. The config so changed is checked by building from it on
meta (:func:`.configs.differences_from`: every parameter and buffer shape, every such int
attribute, every float attribute must be the resized model's); then it replaces the model's
config (a new ``FrozenDict``; a failing resize transaction puts the old one back).

Otherwise the config cannot describe the model: sizes that differ between blocks where the
config has one field for all of them (``norm_num_groups``), or a size the config derives
from another (the sinusoidal time projection is ``block_out_channels[0]`` wide). The config
then keeps its old values and gains an entry :data:`NONUNIFORM`, whose serialization raises
:class:`fxsym.ResizeError` naming what differs, so ``save_pretrained`` (which writes the
config before any weight) fails loudly instead of writing a checkpoint ``from_pretrained``
would rebuild as another model; a :class:`fxsym.ResizeWarning` says so at the resize.

Before a resize, :func:`undescribed_groups` (the ``fxsym_undescribed_groups`` hook) finds
the same way which groups the config could not follow, so ``fxsym.plan(describable=True)``
keeps them whole.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Mapping
from typing import Any

from torch import nn

from fxsym import ResizeError, ResizeWarning
from fxsym.plugins.contracts import Undescribed

from .configs import differences_from, meta_build

#: the config entry of a model its config cannot describe
NONUNIFORM = "fxsym_nonuniform"

Sizes = Mapping[tuple[str, str], tuple[int, int]]


def is_diffusers_model(model: Any) -> bool:
    """Whether ``model`` is a diffusers ``ModelMixin`` (diffusers is never imported here)."""
    diffusers = sys.modules.get("diffusers")
    mixin = getattr(diffusers, "ModelMixin", None) if diffusers is not None else None
    return isinstance(mixin, type) and isinstance(model, mixin)


class NotDescribed:
    """The value of :data:`NONUNIFORM`: what the config cannot describe. diffusers serializes
    a config value with a ``to_dict`` method by calling it: this one refuses."""

    def __init__(self, differences: Mapping[str, Any]) -> None:
        self.differences = dict(differences)

    def to_dict(self) -> dict[str, Any]:
        raise ResizeError(
            "this diffusers model was resized in a way its config cannot describe "
            f"({self}): a checkpoint of it would load as another model; save it with "
            "fxsym.save and load it with fxsym.load into a model built from the original "
            "config")

    def __str__(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in list(self.differences.items())[:4])

    def __repr__(self) -> str:
        return f"NotDescribed({self.differences!r})"


def update_config(model: nn.Module, sizes: Sizes, read: frozenset[str]) -> None:
    """Give ``model`` a config describing it after a resize, or one that says it cannot
    (see the module docstring); ``sizes`` and ``read`` as :func:`.configs.update_config`
    takes them."""
    config = getattr(model, "config", None)
    if not sizes or not isinstance(config, Mapping):
        return
    old = {k: v for k, v in config.items() if k != NONUNIFORM}
    base = meta_build(model, old)
    if base is None:
        return
    before = _sizes_of(base, read)
    now = _sizes_of(model, read)
    olds = {o for o, n in sizes.values() if o != n}
    new = dict(old)
    differences: dict[str, Any] = {}
    for field, index, value in _candidates(old, olds):
        probe = meta_build(model, _with(old, field, index, 2 * value))
        if probe is None:
            continue
        doubled = _sizes_of(probe, read)
        found = {now[k] for k, v in before.items()
                 if v == value and doubled.get(k) == 2 * value and k in now}
        where = f"{field}[{index}]" if index is not None else field
        if len(found) > 1:
            differences[where] = sorted(found)
        elif found and (kept := found.pop()) != value:
            new = _with(new, field, index, kept)
    if not differences:
        fresh = meta_build(model, new)
        differences = (differences_from(model, fresh, read) if fresh is not None
                       else {"config": "the model class refuses it"})
    if differences:
        new = {**old, NONUNIFORM: NotDescribed(differences)}
        warnings.warn(
            f"{type(model).__name__}.config cannot describe the resized model "
            f"({', '.join(differences)} differ between modules or from what the config "
            "derives): save_pretrained will refuse it", ResizeWarning, stacklevel=2)
    if new != dict(config):
        frozen: Any = type(config)  # diffusers' FrozenDict
        vars(model)["_internal_dict"] = frozen(new)


def _candidates(config: Mapping[str, Any], olds: set[int]
                ) -> list[tuple[str, int | None, int]]:
    """``(field, position in a tuple field or None, value)`` of every public int of the
    config whose value a resized dim had."""
    out: list[tuple[str, int | None, int]] = []
    for field, value in config.items():
        if field.startswith("_"):
            continue
        if type(value) is int and value in olds:
            out.append((field, None, value))
        elif isinstance(value, (tuple, list)) and all(type(v) is int for v in value):
            out.extend((field, i, v) for i, v in enumerate(value) if v in olds)
    return out


def _with(config: Mapping[str, Any], field: str, index: int | None, value: int
          ) -> dict[str, Any]:
    out = dict(config)
    if index is None:
        out[field] = value
    else:
        items = list(config[field])
        items[index] = value
        out[field] = type(config[field])(items)
    return out


def _sizes_of(model: nn.Module, read: frozenset[str]) -> dict[str, int]:
    """Every parameter and buffer dim (``"<tensor>:<dim>"``) and every int attribute in
    ``read`` (``"<module>.<attribute>"``) of ``model``: its value."""
    out: dict[str, int] = {}
    for name, t in [*model.named_parameters(remove_duplicate=False),
                    *model.named_buffers(remove_duplicate=False)]:
        for d, n in enumerate(t.shape):
            out[f"{name}:{d}"] = int(n)
    for qual, mod in model.named_modules():
        for attr, value in vars(mod).items():
            key = f"{qual}.{attr}".lstrip(".")
            if type(value) is int and key in read:
                out[key] = value
    return out


def undescribed_groups(model: nn.Module, symmap: Any) -> dict[str, Undescribed]:
    """The searchable groups of ``symmap`` the config could not describe once resized, each
    with the reason (the ``fxsym_undescribed_groups`` hook; ``fxsym.plan(describable=True)``
    keeps them whole).

    What each field sizes is found as :func:`update_config` finds it, by building the class
    on the meta device with the field (or one int of a tuple field) doubled: the parameter
    dims and read int attributes that double are the field's. A field sizing something no
    group resizes (the sinusoidal time projection, as wide as ``block_out_channels[0]``; a
    Fourier projection's random frequencies, as wide as ``time_embedding_dim``) cannot change,
    so every group it sizes stays; one value holds for all a field sizes, so a group that
    stays keeps every group sharing a field with it, and every group of its same-size class
    (a norm group straddling a skip concatenation), whole; and a group no field sizes cannot
    be described at all."""
    from fxsym.prune.importance import layout

    from .configs import attributes_read

    config = getattr(model, "config", None)
    if not isinstance(config, Mapping):
        return {}
    old = {k: v for k, v in config.items() if k != NONUNIFORM}
    base = meta_build(model, old)
    if base is None:
        return {}
    read = attributes_read(symmap)
    before = _sizes_of(base, read)
    owners, elastic = _owners(layout(model, symmap), symmap.groups())
    fields: list[tuple[str, set[str]]] = []
    stays: dict[str, str] = {}
    for field, index, value in _candidates(old, set(before.values())):
        probe = meta_build(model, _with(old, field, index, 2 * value))
        if probe is None:
            continue
        after = _sizes_of(probe, read)
        doubled = [k for k, n in before.items() if n and after.get(k) == 2 * n]
        groups = {g for k in doubled for g in owners.get(k, ())}
        if not groups:
            continue
        where = f"{field}[{index}]" if index is not None else field
        fields.append((where, groups))
        fixed = [k for k in doubled if k not in elastic]
        if fixed:
            what = ", ".join(fixed[:2]) + (f" and {len(fixed) - 2} more" if len(fixed) > 2
                                            else "")
            for g in sorted(groups):
                stays.setdefault(g, f"config field {where} also sizes {what}, which no group "
                                    "resizes")
    described = set().union(*(groups for _, groups in fields)) if fields else set()
    for g in symmap.groups():
        if g.name not in described:
            stays.setdefault(g.name, "no config field sizes it")
    ties = [(f"config field {where}", groups) for where, groups in fields]
    ties += [("a same-size class", {g.name, *g.same_size}) for g in symmap.groups()
             if g.same_size]
    changed = True
    while changed:
        changed = False
        for what, groups in ties:
            held = sorted(groups & stays.keys())
            for g in sorted(groups - stays.keys()) if held else ():
                stays[g] = f"{what} holds it and {held[0]}, which stays"
                changed = True
    return {g: Undescribed(why) for g, why in stays.items()}


def _owners(lay: Any, groups: Any) -> tuple[dict[str, set[str]], set[str]]:
    """Per parameter dim (``"<tensor>:<dim>"``) and attribute member (``"<module>.<name>"``)
    of a group: the groups resizing it; and the keys groups resize whole."""
    owners: dict[str, set[str]] = {}
    covered: dict[str, set[int]] = {}
    for name, slices in lay.slices.items():
        for s in slices:
            key = f"{s.param}:{s.dim}"
            owners.setdefault(key, set()).add(name)
            covered.setdefault(key, set()).update(s.index.tolist())
    elastic = {k for k, idx in covered.items()
               if len(idx) == lay.shapes[k.rpartition(":")[0]][int(k.rpartition(":")[2])]}
    for g in groups:
        if g.size < 2:
            continue
        for qualname, sname in g.members:
            if sname.startswith("attr:"):
                key = f"{qualname}.{sname[5:]}".lstrip(".")
                owners.setdefault(key, set()).add(g.name)
                elastic.add(key)
    return owners, elastic
