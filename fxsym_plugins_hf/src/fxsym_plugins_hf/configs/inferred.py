"""Config fields beyond the measured ones (:mod:`.measuring`), each only a candidate that a
model built from the config must confirm (:func:`.builds.config_differences`):

* the head count that keeps ``head_dim`` where the hidden size changed and nothing measured
  the heads (attention traced through whose head split pins ``head_dim``:
  :func:`heads_of_pinned_head_dim`), or a ``head_dim`` attribute given to a family deriving
  ``hidden // heads`` but reading ``getattr(config, "head_dim", ...)`` first
  (:func:`with_head_dim`);
* any other int field whose value was the old length of a dimension the resize changed
  (DeBERTa's ``pooler_hidden_size``: :func:`probed_fields`), or that sets, when the model is
  built, a module attribute the resize changed (a router's ``num_group``:
  :func:`attribute_fields`), found by building the model with the field set to another value;
* a field that held the same value as a changed one and that the resized forward still
  depends on (DeepSeek's ``num_key_value_heads``: :func:`companion_fields`), and int
  attributes the forward reads that no field holds, given as a field of their name (Phi-3's
  ``head_dim``: :func:`fields_read_by_name`).

Imports from the plugin: configs.builds, configs.fields, configs.prober.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from .builds import config_differences
from .fields import FIELDS, Sizes, field_scope, old_value, size_fields
from .prober import Prober


def take_probed(probed: dict[str, dict[str, int]], before: Any, new: Any,
                 changed: list[str], nonuniform: dict[str, dict[str, int]]) -> None:
    """Set on ``new`` each probed field that every module gives the same value (and that
    value is new); a field the modules give different values goes to ``nonuniform``."""
    for field, found in probed.items():
        if len(set(found.values())) > 1:
            nonuniform[field] = found
        elif getattr(before, field) != (value := next(iter(found.values()))):
            setattr(new, field, value)
            changed.append(field)


def heads_of_pinned_head_dim(config: Any, new: Any, changed: list[str],
                              measured: list[str]) -> list[str]:
    """Where the hidden size changed and nothing measured the query heads (attention traced
    through that holds no head count: the family derives ``head_dim = hidden // heads``),
    the head count that keeps ``head_dim``: the head split of attention traced through pins
    ``head_dim``. Only a candidate: :func:`config_differences` checks it."""
    hidden = size_fields(config, FIELDS["hidden_size"])
    heads = [f for f in size_fields(config, FIELDS["num_attention_heads"])
             if field_scope(f) is None]
    if (len(hidden) != 1 or len(heads) != 1 or hidden[0] not in changed
            or heads[0] in measured or size_fields(config, FIELDS["head_dim"])):
        return []
    old_hidden, old_heads = old_value(config, hidden[0]), old_value(config, heads[0])
    width = old_value(new, hidden[0])
    if not old_hidden or not old_heads or not width or old_hidden % old_heads:
        return []
    head_dim = old_hidden // old_heads
    if width % head_dim:
        return []
    setattr(new, heads[0], width // head_dim)
    return [heads[0]]


def with_head_dim(model: nn.Module, new: Any, derived: dict[str, dict[str, int]],
                   read: frozenset[str]) -> bool:
    """Where the config has no ``head_dim`` field and derives one the attention does not
    have: give ``new`` a ``head_dim`` attribute, kept (``True``) if the model built from it
    then holds what the resized model holds (families that read
    ``getattr(config, "head_dim", ...)``)."""
    values = set(derived["head_dim"].values())
    if len(values) != 1:
        return False
    new.head_dim = values.pop()
    if config_differences(model, new, read):
        delattr(new, "head_dim")
        return False
    return True


def probed_fields(prober: Prober, before: Any, sizes: Sizes, skip: set[str]
                   ) -> dict[str, dict[str, int]]:
    """The other int fields of the config (not in :data:`FIELDS`, not in ``skip``) whose value
    was the old length of a dimension the resize changed (DeBERTa's ``pooler_hidden_size``)
    and whose dims did change (:meth:`Prober.follow`): candidates, which
    :func:`config_differences` checks."""
    olds = {old for old, now in sizes.values() if old != now}
    out: dict[str, dict[str, int]] = {}
    for field, old in vars(before).items():
        if (field in skip or field.startswith("_") or not isinstance(old, int)
                or isinstance(old, bool) or old not in olds):
            continue
        found = prober.follow(field, old)
        if found and any(v != old for v in found.values()):
            out[field] = found
    return out


def attributes_differ(differences: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether ``differences`` (:func:`config_differences`) holds an int attribute."""
    return any(not key.endswith(".shape") and any(
        type(v) is int for v in where.values()) for key, where in differences.items())


def attribute_fields(prober: Prober, before: Any, sizes: Sizes, skip: set[str]
                      ) -> dict[str, dict[str, int]]:
    """The int fields of the config (not in ``skip``) that set, when the model is built, a
    module attribute the resize changed as a member of a group (a router's ``num_group``,
    built from ``n_group``, where the experts drop whole routing groups), found by building
    the model with the field set to another value (:meth:`Prober.attributes_following`):
    ``{field: {module.attribute: value now}}`` over every attribute that follows the field
    (an attribute a resize left alone counts with its value)."""
    changed = {(q, m.removeprefix("attr:")) for (q, m), (old, now) in sizes.items()
               if m.startswith("attr:") and "." not in m and "[" not in m and old != now}
    olds = {sizes[(q, f"attr:{a}")][0] for q, a in changed}
    modules = dict(prober.model.named_modules())
    out: dict[str, dict[str, int]] = {}
    for field, old in vars(before).items():
        if (field in skip or field.startswith("_") or type(old) is not int
                or old not in olds):
            continue
        follows = prober.attributes_following(field, old)
        if not follows & changed:
            continue
        found = {f"{q}.{a}": vars(modules[q]).get(a) for q, a in sorted(follows)
                 if q in modules}
        out[field] = {k: v for k, v in found.items() if type(v) is int}
    return out


def companion_fields(model: nn.Module, before: Any, new: Any, changed: list[str],
                      skip: set[str], read: frozenset[str],
                      differences: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Fields (not in ``skip``) that held the same value as a field this update changed and
    that the resized forward still depends on through an int attribute it reads: DeepSeek's
    ``num_key_value_heads``, equal to ``num_attention_heads`` and sizing nothing but
    ``num_key_value_groups = heads // kv_heads``. Each is given the changed field's new value
    in ``new`` where the model built from the config then differs from the resized one in
    fewer int attributes (:func:`config_differences`); only a candidate otherwise, left as it
    was."""
    count = sum(1 for key, where in differences.items() if not key.endswith(".shape")
                and any(type(v) is int for v in where.values()))
    out: list[str] = []
    for field in list(changed):
        old, now = getattr(before, field, None), getattr(new, field, None)
        if type(old) is not int or type(now) is not int or old == now:
            continue
        for other, value in vars(before).items():
            if (other in skip or other in changed or other in out or other.startswith("_")
                    or type(value) is not int or value != old):
                continue
            setattr(new, other, now)
            left = config_differences(model, new, read)
            fewer = sum(1 for key, where in left.items() if not key.endswith(".shape")
                        and any(type(v) is int for v in where.values()))
            if fewer < count and not any(k.endswith(".shape") for k in left if
                                         k not in differences):
                out.append(other)
                count = fewer
            else:
                setattr(new, other, value)
    return out


def fields_read_by_name(model: nn.Module, new: Any, skip: set[str], read: frozenset[str],
                         differences: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Int attributes the resized forward reads that hold one value in every module and that
    the config has no field of (not in ``skip``), given to ``new`` as a field of their name:
    kept where the model built from the config then differs in fewer places and in no new
    one (Phi-3's attention reads ``getattr(config, "head_dim", hidden // heads)``: a
    ``head_dim`` field describes heads wider than the hidden size divides into)."""
    def places(found: Mapping[str, Mapping[str, Any]]) -> int:
        return sum(len(where) for where in found.values())

    out: list[str] = []
    for attr, where in list(differences.items()):
        values = {v for v in where.values() if type(v) is int}
        if (attr.endswith(".shape") or attr in skip or attr.startswith("_") or len(values) != 1
                or len(where) != sum(type(v) is int for v in where.values())
                or isinstance(getattr(type(new), attr, None), property)):  # computed, not set
            continue
        value = values.pop()
        setattr(new, attr, value)
        left = config_differences(model, new, read)
        if left.keys() <= differences.keys() and places(left) < places(differences):
            out.append(attr)
            differences = left
        else:
            delattr(new, attr)
    return out
