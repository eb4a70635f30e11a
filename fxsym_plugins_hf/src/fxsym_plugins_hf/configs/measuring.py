"""The sizes the resized modules hold, for each field of :data:`.fields.FIELDS`
(:func:`measure`): read from the resized modules, not from the groups chosen, so any resize
(heads, ``head_dim``, hidden size, MLP) is seen the same way:

* every attention module with query/key/value projections (a leaf or traced through): the
  hidden size it reads, its query heads, key/value heads and ``head_dim``
  (:func:`..attention.current_layout`), the head counts in the units of their fields: as many
  ``head_dim`` blocks of the projection per unit as the model built from the config before
  the resize holds (Qwen3-Next's query projection holds a gate beside each query head);
* the MLP: the parameter dims that follow the intermediate field when the model is built on
  the meta device from the old config and from one with that field changed
  (:class:`.prober.Prober`), never the projections whose length happens to be equal (an LM
  head with ``vocab_size == intermediate_size``); only a class that cannot be built on meta
  falls back to the ``nn.Linear``/``Conv1D`` outside attention whose features were
  ``(hidden, intermediate)`` or ``(intermediate, hidden)`` before the resize;
* attention traced through: the head counts and ``head_dim`` attributes the resize changed as
  group members (``(module, "attr:num_heads")``; a field of the shared config written in place,
  ``"attr:config.num_attention_heads"``, counts with its old value from ``sizes``:
  :func:`config_before`);
* the input embeddings' width, for a hidden or embedding size field equal to it before.

Where the config has no ``head_dim`` field and the value the family derives (``hidden //
heads``) is not the measured one, :func:`derived_mismatches` says so.

Imports from the plugin: attention, configs.builds, configs.fields, configs.prober.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch import nn

from ..attention import (
    HEAD_COUNT_ATTRS,
    HEAD_DIM_ATTRS,
    KV_COUNT_ATTRS,
    projection_features,
)
from .builds import attention_layouts
from .fields import FIELDS, Sizes, derived_mlp, field_scope, old_value, size_fields
from .prober import Prober

#: what fields size the dims that follow them when the model is built (:class:`Prober`)
_PROBED = ("intermediate_size", "num_experts")
#: where a layout is read from attention modules: its position in ``current_layout``
_ATTENTION = {"hidden_size": 0, "num_attention_heads": 1, "num_key_value_heads": 2,
              "head_dim": 3}
#: the module attributes (attribute members of groups) that hold a size of attention traced
#: through
_ATTRIBUTES = {"num_attention_heads": HEAD_COUNT_ATTRS, "num_key_value_heads": KV_COUNT_ATTRS,
               "head_dim": HEAD_DIM_ATTRS}


def config_before(model: nn.Module, config: Any, sizes: Sizes) -> tuple[Any, list[str]]:
    """A copy of ``config`` as it was before the resize, and the fields the resize wrote in
    place (an attribute member ``(module, "attr:config.num_attention_heads")`` of a module
    holding ``config``)."""
    before = copy.deepcopy(config)
    written: list[str] = []
    for (qualname, member), (old, _) in sizes.items():
        field = member.removeprefix("attr:config.")
        if field != member and "." not in field and getattr(
                model.get_submodule(qualname), "config", None) is config:
            setattr(before, field, old)
            if field not in written:
                written.append(field)
    return before, written


def measure(model: nn.Module, config: Any, what: str, field: str, sizes: Sizes,
           attention: Mapping[str, tuple[int, int, int, int]], prober: Prober
           ) -> dict[str, int]:
    """``{module qualname: size now}`` for what ``field`` sizes: the dims that follow the
    field when the model is built from it (the MLP's), the attention leaves' layouts, else
    the attention modules traced through (their attributes) or the input embeddings."""
    scope = field_scope(field)
    if what in _PROBED:
        old = old_value(config, field)
        if what == "intermediate_size":
            old = old or derived_mlp(config)
        probed = prober.follow(field, old)
        if probed is not None:
            prober.set_attributes(field, old, probed)
        if probed is None and what == "intermediate_size":
            return _mlp_sizes(model, config, field, sizes, attention)
        return probed or {}
    found: dict[str, int] = {}
    if what in _ATTENTION:
        found = {q: lay[_ATTENTION[what]] for q, lay in attention.items()
                 if scope is None or scope in q.split(".")}
        if what in ("num_attention_heads", "num_key_value_heads"):
            found = _in_field_units(prober, field, found, _ATTENTION[what])
    if not found and what in _ATTRIBUTES:
        found = _attribute_sizes(model, _ATTRIBUTES[what], sizes, scope)
    if not found and what in ("hidden_size", "embedding_size"):
        found = _embedding_size(model, old_value(config, field), sizes)
    if not found and what == "num_attention_heads":
        found = prober.follow_units(field, old_value(config, field)) or {}
    return found


def _in_field_units(prober: Prober, field: str, found: Mapping[str, int], position: int
                    ) -> dict[str, int]:
    """Head counts ``found`` (projection rows over ``head_dim``,
    :func:`.attention.current_layout`) in the units ``field`` counts: the model built from the
    config before the resize on the meta device (:meth:`Prober.base_layouts`) shows how many
    ``head_dim`` blocks of a module's projection one unit of the field gives (Qwen3-Next's
    query projection holds a gate beside each query head: 2 blocks per head), where the blocks
    follow the field (three times as many when built with the field tripled, :class:`Prober`;
    a field the module ignores, as HRM's ``num_key_value_heads``, proves nothing); a count is
    divided by that where it is a whole number of units, and kept as measured where the builds
    do not say (no build, no such module, blocks not following or not a multiple of the
    field's old value).
    :func:`config_differences` checks the config written."""
    old = old_value(prober.before, field)
    base = prober.base_layouts() if old else {}
    if old is None or not base or all(
            base[n][position] == old for n in found if n in base):  # nothing to convert
        return dict(found)
    probed = prober.probe_build(field, old)
    grown = {} if probed is None else attention_layouts(probed)
    out: dict[str, int] = {}
    for name, now in found.items():
        layout, other = base.get(name), grown.get(name)
        blocks = layout[position] if layout is not None else old
        follows = other is not None and other[position] == 3 * blocks
        per_unit = blocks // old if follows and blocks % old == 0 and blocks > old else 1
        out[name] = now // per_unit if now % per_unit == 0 else now
    return out


def _attribute_sizes(model: nn.Module, names: tuple[str, ...], sizes: Sizes,
                     scope: str | None) -> dict[str, int]:
    """The values now of the attributes among ``names`` that the resize changed as members
    of a group (``(module, "attr:num_heads")``), read in every module of the classes that
    hold them (a layer left alone counts with its unchanged value)."""
    held: set[tuple[type, str]] = set()
    for qualname, member in sizes:
        attr = member.removeprefix("attr:")
        if attr != member and attr in names:
            held.add((type(model.get_submodule(qualname)), attr))
    found: dict[str, int] = {}
    for name, mod in model.named_modules():
        if scope is not None and scope not in name.split("."):
            continue
        for cls, attr in held:
            value = vars(mod).get(attr)
            if type(mod) is cls and isinstance(value, int):
                found[name] = value
    return found


def _embedding_size(model: nn.Module, old: int | None, sizes: Sizes) -> dict[str, int]:
    """The input embeddings' width now, if it was ``old`` before the resize (the field is
    then the embeddings' width)."""
    get = getattr(model, "get_input_embeddings", None)
    try:
        emb = get() if callable(get) else None
    except (AttributeError, NotImplementedError):
        return {}
    if not isinstance(emb, nn.Embedding) or old is None:
        return {}
    name = next((n for n, m in model.named_modules() if m is emb), None)
    if name is None or sizes.get((name, "embedding_dim"), (emb.embedding_dim,))[0] != old:
        return {}
    return {name: emb.embedding_dim}


def _mlp_sizes(model: nn.Module, config: Any, field: str, sizes: Sizes,
               attention: Mapping[str, Any]) -> dict[str, int]:
    """The intermediate width, now, of every projection outside attention that mapped the
    hidden size to ``field``'s value before the resize (its output features) or that value
    back to the hidden size (its input features); ``None`` stands for four times the hidden
    size, as GPT-2 and its relatives derive it."""
    hidden_fields = size_fields(config, FIELDS["hidden_size"])
    hidden = old_value(config, hidden_fields[0] if hidden_fields else None)
    if hidden is None:
        return {}
    inter = old_value(config, field)
    inter = 4 * hidden if inter is None else inter
    scope = field_scope(field)
    heads = _head_splitting(model, attention)
    found: dict[str, int] = {}
    for name, mod in model.named_modules():
        features = projection_features(mod)
        if features is None or any(name.startswith(f"{a}.") for a in heads):
            continue
        if isinstance(mod, nn.Linear):  # resized by weight dimension, its attributes may lag
            features = (mod.weight.shape[1], mod.weight.shape[0])
        if scope is not None and scope not in name.split("."):
            continue
        old = _old_features(mod, name, features, sizes)
        if old == (hidden, inter):
            found[name] = features[1]
        elif old == (inter, hidden):
            found[name] = features[0]
    return found


def _old_features(mod: nn.Module, name: str, features: tuple[int, int], sizes: Sizes
                  ) -> tuple[int, int]:
    """A projection's ``(in, out)`` features before the resize, whether the resize named
    them by feature or by weight dimension (a projection traced through)."""
    linear = isinstance(mod, nn.Linear)
    members = (("in_features", "weight:1" if linear else "weight:0"),
               ("out_features", "weight:0" if linear else "weight:1"))
    out: list[int] = []
    for now, names in zip(features, members, strict=True):
        old = next((sizes[(name, m)][0] for m in names if (name, m) in sizes), now)
        out.append(old)
    return out[0], out[1]


def _head_splitting(model: nn.Module, attention: Mapping[str, Any]) -> list[str]:
    """The qualified names of the attention leaves and of the modules traced through that
    hold a head count or ``head_dim`` and projections of their own (they split heads: their
    projections are not MLP; a decoder layer holding a head count is not one)."""
    names = HEAD_COUNT_ATTRS + KV_COUNT_ATTRS + HEAD_DIM_ATTRS
    out = list(attention)
    for name, mod in model.named_modules():
        if name and name not in attention and any(
                isinstance(vars(mod).get(a), int) for a in names) and any(
                projection_features(c) is not None for c in mod.children()):
            out.append(name)
    return out


def derived_mismatches(config: Any, attention: Mapping[str, tuple[int, int, int, int]]
                        ) -> dict[str, dict[str, int]]:
    """``head_dim`` where the config has no field for it and ``hidden // heads`` (what the
    family derives) is not the measured one."""
    if size_fields(config, FIELDS["head_dim"]) or not attention:
        return {}
    hidden = [f for f in size_fields(config, FIELDS["hidden_size"])]
    heads = [f for f in size_fields(config, FIELDS["num_attention_heads"])]
    if not hidden or not heads:
        return {}
    out: dict[str, dict[str, int]] = {}
    for q, (_, _, _, hd) in attention.items():
        stack = [f for f in heads if field_scope(f) is None or field_scope(f) in q.split(".")]
        n_heads = old_value(config, stack[0]) if stack else None
        width = old_value(config, hidden[0])
        if n_heads and width and width // n_heads != hd:
            out = {"head_dim": {q2: lay[3] for q2, lay in attention.items()}}
            break
    return out
