"""``model.config`` after :func:`fxsym.resize` (the ``fxsym_after_resize`` hook).

A Hugging Face model is rebuilt from its config (``from_pretrained``, ``from_config``), so after
a resize the config must describe the resized model. :func:`update_config` reads the sizes
from the resized modules, not from the groups chosen, so any resize (heads, ``head_dim``,
hidden size, MLP) is seen the same way:

* every attention module with query/key/value projections (a leaf or traced through): the
  hidden size it reads, its query heads, key/value heads and ``head_dim``
  (:func:`.attention.current_layout`), the head counts in the units of their fields: as many
  ``head_dim`` blocks of the projection per unit as the model built from the config before
  the resize holds (Qwen3-Next's query projection holds a gate beside each query head);
* the MLP: the parameter dims that follow the intermediate field when the model is built on
  the meta device from the old config and from one with that field changed
  (:class:`_Prober`), never the projections whose length happens to be equal (an LM head
  with ``vocab_size == intermediate_size``); only a class that cannot be built on meta falls
  back to the ``nn.Linear``/``Conv1D`` outside attention whose features were
  ``(hidden, intermediate)`` or ``(intermediate, hidden)`` before the resize;
* attention traced through: the head counts and ``head_dim`` attributes the resize changed as
  group members (``(module, "attr:num_heads")``; a field of the shared config written in place,
  ``"attr:config.num_attention_heads"``, counts with its old value from ``sizes``), else the
  head count that keeps ``head_dim`` (their head split pins it), checked by building;
* the input embeddings' width, for a hidden or embedding size field equal to it before.

Where a model built from the config so updated still holds other parameter shapes, any other
int field whose value was the old length of a dimension the resize changed (DeBERTa's
``pooler_hidden_size``) is measured where it sizes something: the model is built on the meta
device from the old config and from one with that field set to another value, and the
parameter dims that follow the field are read in the resized model.

A family deriving ``head_dim`` from ``hidden // heads`` but reading a ``head_dim`` attribute of
its config first is given one where the model built from the config then matches.

A config the class's own checks refuse (Llama's ``hidden_size`` 39 with 4 heads of
``head_dim`` 16) cannot describe the model either: each field changed counts as one size for
the whole model (module ``""``).

Each config field that holds one of these sizes (:data:`FIELDS`, through the config's
``attribute_map``; a field named ``encoder_*``/``decoder_*`` counts only the modules of that
stack) is set where the size is alike in every module. Where it differs, or where the config
has no field for it and the value the family derives (``head_dim = hidden // heads``,
``intermediate = 4 * hidden``) is not the measured one, the config says so in
:data:`NONUNIFORM`: ``{field: {module qualname: size}}`` (the field itself holds the largest
size), and a :class:`fxsym.ResizeWarning` names the fields.

Such a config must not load a model as the original architecture: :func:`fxsym.save` writes
it as a checkpoint of fxsym's own model type, with the sizes per module and a loader
(:mod:`.checkpoint`). Where the largest sizes would fail the config class's own checks
(``hidden_size`` a multiple of the heads), the fields keep their values from before the
resize, so the config can still be copied, validated and written. They keep them too where a
model built from the config would hold the resized weights (every parameter at its shape) but
compute something else (Gemma's embeddings scaled by ``sqrt`` of the new hidden size, where the
resized model keeps the old scale): transformers' own ``save_pretrained`` then writes a
checkpoint whose weights no model of that config fits, so ``from_pretrained`` refuses it
instead of loading another model.

The config is copied, never changed in place: every module holding the old config (or one of
its sub-configs) is given the copy, so a failing resize transaction restores the old one. A
copy of the config the model had before fxsym first resized it (the fields a resize wrote in
place put back) stays on the model as :data:`UNPRUNED` (removed with the module's other new
attributes if the resize fails): a checkpoint whose config cannot describe the model is loaded
by building that one and replaying the plan.
"""

from __future__ import annotations

import copy
import pickle
import warnings
from collections.abc import Hashable, Mapping
from typing import Any

import torch
from torch import nn

from fxsym import ResizeWarning
from fxsym.memo import remembered

from .attention import (
    HEAD_COUNT_ATTRS,
    HEAD_DIM_ATTRS,
    KV_COUNT_ATTRS,
    current_layout,
    projection_features,
)
from .metainit import no_meta_init

#: the config attribute that records sizes the config cannot hold as one value
NONUNIFORM = "fxsym_nonuniform"
#: the model attribute holding the config the model had before fxsym first resized it
UNPRUNED = "_fxsym_unpruned_config"

#: what a config field sizes -> the names families give it (canonical name first)
FIELDS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim", "embed_dim", "n_embed"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads",
                            "encoder_attention_heads", "decoder_attention_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "head_dim": ("head_dim", "d_kv", "kv_channels"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim",
                          "encoder_ffn_dim", "decoder_ffn_dim", "ffn_hidden_size"),
    "embedding_size": ("embedding_size", "word_embed_proj_dim"),
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
}
#: what fields size the dims that follow them when the model is built (:class:`_Prober`)
_PROBED = ("intermediate_size", "num_experts")
#: where a layout is read from attention modules: its position in ``current_layout``
_ATTENTION = {"hidden_size": 0, "num_attention_heads": 1, "num_key_value_heads": 2,
              "head_dim": 3}
#: the module attributes (attribute members of groups) that hold a size of attention traced
#: through
_ATTRIBUTES = {"num_attention_heads": HEAD_COUNT_ATTRS, "num_key_value_heads": KV_COUNT_ATTRS,
               "head_dim": HEAD_DIM_ATTRS}

Sizes = Mapping[tuple[str, str], tuple[int, int]]


def update_config(model: nn.Module, sizes: Sizes, read: frozenset[str] = frozenset()) -> None:
    """Give ``model`` (and every module sharing its config) a copy of its config describing
    the resized model; ``sizes`` is the ``fxsym_after_resize`` argument, ``read`` the
    qualified names of the attributes the traced ``forward`` reads (:func:`attributes_read`)."""
    config = getattr(model, "config", None)
    if not sizes or config is None or not hasattr(config, "to_dict"):
        return
    attention = _attention_layouts(model)
    memo: dict[int, Any] = {}
    new = copy.deepcopy(config, memo)
    before, changed = _before(model, config, sizes)
    if UNPRUNED not in vars(model):  # before fxsym's first resize (fields it wrote put back)
        vars(model)[UNPRUNED] = copy.deepcopy(before)
    prober = _Prober(model, before)
    written = frozenset(changed)  # read by the resized model's own forward: never reverted
    nonuniform: dict[str, dict[str, int]] = {}
    measured: list[str] = []
    for what, names in FIELDS.items():
        for field in size_fields(before, names):
            found = _found(model, before, what, field, sizes, attention, prober)
            if not found:
                continue
            measured.append(field)
            if len(set(found.values())) > 1:
                nonuniform[field] = found
            value = max(found.values())
            if getattr(before, field) != value and field not in changed:
                setattr(new, field, value)
                changed.append(field)
    if not nonuniform:
        changed += _heads_of_pinned_head_dim(before, new, changed, measured + changed)
    derived = _derived_mismatches(new, attention)
    if not (derived and not nonuniform and _with_head_dim(model, new, derived, read)):
        nonuniform.update(derived)
    for field in _read_fields(read) - written:  # the resized forward reads it as it is now
        if getattr(new, field, None) != getattr(config, field, None):
            setattr(new, field, getattr(config, field))
    if not nonuniform:  # the config claims to describe the model: check the claim
        differences = _differences(model, new, read)
        if any(key.endswith(".shape") for key in differences):  # fields of other names?
            known = {f for names in FIELDS.values() for f in size_fields(before, names)}
            skip = known | set(changed) | _read_fields(read)
            _take_probed(_probed_fields(prober, before, sizes, skip), before, new, changed,
                         nonuniform)
            if not nonuniform:
                differences = _differences(model, new, read)
        if _attributes_differ(differences):  # int attributes read: set by other fields?
            skip = set(changed) | _read_fields(read)
            _take_probed(_attribute_fields(prober, before, sizes, skip), before, new, changed,
                         nonuniform)
            if not nonuniform:
                differences = _differences(model, new, read)
        if not nonuniform and _attributes_differ(differences):
            skip = set(changed) | _read_fields(read)
            for field in _companion_fields(model, before, new, changed, skip, read,
                                           differences):
                changed.append(field)
            differences = _differences(model, new, read)
        if not nonuniform and _attributes_differ(differences):
            skip = set(vars(before)) | _read_fields(read)
            for field in _fields_read_by_name(model, new, skip, read, differences):
                changed.append(field)
            differences = _differences(model, new, read)
        nonuniform.update(differences)
    if not nonuniform and not config_accepted(new):  # alike everywhere, but not as the class allows
        nonuniform = {field: {"": getattr(new, field)} for field in changed}
    if nonuniform:
        why = undescribed(model, before, new, changed, nonuniform)
        setattr(new, NONUNIFORM, nonuniform)
        fits = _weights_fit(model, new)
        if fits or not config_accepted(new):
            for field in changed:
                if field not in written:
                    setattr(new, field, getattr(before, field))
        kept = (f"; its size fields keep their values from before the resize, since a "
                f"{type(model).__name__} built from them would hold these weights and compute "
                "something else (fxsym.save writes a checkpoint that loads the resized model)"
                if fits else "")
        warnings.warn(
            f"{type(model).__name__}.config does not describe the resized model: "
            f"{'; '.join(why)} (config.{NONUNIFORM} holds each module's value){kept}",
            ResizeWarning, stacklevel=2)
    else:
        if NONUNIFORM in vars(new):
            delattr(new, NONUNIFORM)
    if new.to_dict() == config.to_dict():
        return
    for mod in model.modules():
        state = vars(mod)
        for key, value in list(state.items()):
            if id(value) in memo and hasattr(value, "to_dict"):
                state[key] = memo[id(value)]


def _weights_fit(model: nn.Module, config: Any) -> bool:
    """Whether a model of ``model``'s class built from ``config`` (on the meta device) holds
    every parameter of ``model`` at its shape: then ``save_pretrained`` and ``from_pretrained``
    would load the weights into it without a word."""
    built = meta_build(model, config)
    if built is None:
        return False
    theirs = dict(built.named_parameters(remove_duplicate=False))
    return all(n in theirs and theirs[n].shape == p.shape
               for n, p in model.named_parameters(remove_duplicate=False))


def undescribed(model: nn.Module, before: Any, new: Any, changed: list[str],
                nonuniform: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the config ``new`` cannot describe, one phrase per entry of ``nonuniform``, from
    what the probes found: a size that differs between modules, a value the config's own
    checks refuse, or a value alike everywhere that a model built from ``new`` has otherwise
    (and the changed fields it follows when the model is built: ``before``'s value of each
    put back in turn)."""
    fresh = meta_build(model, new)
    built = {} if fresh is None else dict(fresh.named_modules())
    cls = type(model).__name__
    out: list[str] = []
    for key, where in nonuniform.items():
        places = list(where.items())
        if "" in where:
            out.append(f"{key} {_shown(where[''])}: {type(new).__name__}'s own checks refuse it")
            continue
        more = f" and {len(places) - 2} more" if len(places) > 2 else ""
        first: dict[str, str] = {}  # each value, where it is first
        for m, v in places:
            first.setdefault(_shown(v), m)
        if len(first) > 1:
            out.append(f"{key} differs between modules ("
                       + ", ".join(f"{v} in {m}" for v, m in list(first.items())[:3])
                       + (", ..." if len(first) > 3 else "") + ")")
            continue
        (module, value), shown = places[0], ", ".join(m for m, _ in places[:2]) + more
        own = _built_value(built, module, key)
        if own is None:
            out.append(f"{key} is {_shown(value)} in {shown}, which no field of the config "
                       "gives")
            continue
        follows = [f for f in changed if _built_value(_rebuilt(model, new, f, before), module,
                                                      key) not in (None, own)]
        out.append(f"{key} is {_shown(value)} in {shown}, but a {cls} built from the config "
                   f"has {_shown(own)}" + (f" (it follows {', '.join(follows)} when the "
                                            "model is built)" if follows else ""))
    return out


def _shown(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _rebuilt(model: nn.Module, config: Any, field: str, before: Any) -> dict[str, nn.Module]:
    """The modules of the model built from ``config`` with ``field`` as in ``before``."""
    probe = copy.deepcopy(config)
    setattr(probe, field, getattr(before, field))
    fresh = meta_build(model, probe)
    return {} if fresh is None else dict(fresh.named_modules())


def _built_value(built: Mapping[str, nn.Module], module: str, key: str) -> Any:
    """``key`` (an attribute, or ``"<tensor>.shape"``) of ``module`` in a built model;
    ``None`` where it has none."""
    mod = built.get(module)
    if mod is None:
        return None
    if key.endswith(".shape"):
        name = key.removesuffix(".shape")
        tensors = {**dict(mod.named_parameters(recurse=False)),
                   **dict(mod.named_buffers(recurse=False))}
        return list(tensors[name].shape) if name in tensors else None
    return vars(mod).get(key)


def _take_probed(probed: dict[str, dict[str, int]], before: Any, new: Any,
                 changed: list[str], nonuniform: dict[str, dict[str, int]]) -> None:
    """Set on ``new`` each probed field that every module gives the same value (and that
    value is new); a field the modules give different values goes to ``nonuniform``."""
    for field, found in probed.items():
        if len(set(found.values())) > 1:
            nonuniform[field] = found
        elif getattr(before, field) != (value := next(iter(found.values()))):
            setattr(new, field, value)
            changed.append(field)


def config_accepted(config: Any) -> bool:
    """Whether the config class's own checks accept ``config`` (``save_pretrained`` runs
    them)."""
    validate = getattr(config, "validate", None)
    if validate is None:
        return True
    try:
        validate()
    except Exception:  # any failing check: huggingface_hub wraps each in its own error type
        return False
    return True


def size_fields(config: Any, names: tuple[str, ...]) -> list[str]:
    """The config's own attributes among ``names`` (``attribute_map`` aliases followed),
    once each."""
    aliases: Mapping[str, str] = getattr(config, "attribute_map", {}) or {}
    out: list[str] = []
    for name in names:
        real = aliases.get(name, name)
        if real in vars(config) and real not in out:
            value = vars(config)[real]
            if value is None or (isinstance(value, int) and not isinstance(value, bool)):
                out.append(real)
    return out


def _scope(field: str) -> str | None:
    """The stack a field is about (``encoder_ffn_dim``: the encoder's), or ``None``."""
    prefix = field.partition("_")[0]
    return prefix if prefix in ("encoder", "decoder") else None


def _before(model: nn.Module, config: Any, sizes: Sizes) -> tuple[Any, list[str]]:
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


def _found(model: nn.Module, config: Any, what: str, field: str, sizes: Sizes,
           attention: Mapping[str, tuple[int, int, int, int]], prober: _Prober
           ) -> dict[str, int]:
    """``{module qualname: size now}`` for what ``field`` sizes: the dims that follow the
    field when the model is built from it (the MLP's), the attention leaves' layouts, else
    the attention modules traced through (their attributes) or the input embeddings."""
    scope = _scope(field)
    if what in _PROBED:
        old = _old_value(config, field)
        if what == "intermediate_size":
            old = old or _derived_mlp(config)
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
        found = _embedding_size(model, _old_value(config, field), sizes)
    if not found and what == "num_attention_heads":
        found = prober.follow_units(field, _old_value(config, field)) or {}
    return found


def _in_field_units(prober: _Prober, field: str, found: Mapping[str, int], position: int
                    ) -> dict[str, int]:
    """Head counts ``found`` (projection rows over ``head_dim``,
    :func:`.attention.current_layout`) in the units ``field`` counts: the model built from the
    config before the resize on the meta device (:meth:`_Prober.base_layouts`) shows how many
    ``head_dim`` blocks of a module's projection one unit of the field gives (Qwen3-Next's
    query projection holds a gate beside each query head: 2 blocks per head), where the blocks
    follow the field (three times as many when built with the field tripled, :class:`_Prober`;
    a field the module ignores, as HRM's ``num_key_value_heads``, proves nothing); a count is
    divided by that where it is a whole number of units, and kept as measured where the builds
    do not say (no build, no such module, blocks not following or not a multiple of the
    field's old value).
    :func:`_differences` checks the config written."""
    old = _old_value(prober.before, field)
    base = prober.base_layouts() if old else {}
    if old is None or not base or all(
            base[n][position] == old for n in found if n in base):  # nothing to convert
        return dict(found)
    probed = prober.probe_build(field, old)
    grown = {} if probed is None else _attention_layouts(probed)
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


def _heads_of_pinned_head_dim(config: Any, new: Any, changed: list[str],
                              measured: list[str]) -> list[str]:
    """Where the hidden size changed and nothing measured the query heads (attention traced
    through that holds no head count: the family derives ``head_dim = hidden // heads``),
    the head count that keeps ``head_dim``: the head split of attention traced through pins
    ``head_dim``. Only a candidate: :func:`_differences` checks it."""
    hidden = size_fields(config, FIELDS["hidden_size"])
    heads = [f for f in size_fields(config, FIELDS["num_attention_heads"]) if _scope(f) is None]
    if (len(hidden) != 1 or len(heads) != 1 or hidden[0] not in changed
            or heads[0] in measured or size_fields(config, FIELDS["head_dim"])):
        return []
    old_hidden, old_heads = _old_value(config, hidden[0]), _old_value(config, heads[0])
    width = _old_value(new, hidden[0])
    if not old_hidden or not old_heads or not width or old_hidden % old_heads:
        return []
    head_dim = old_hidden // old_heads
    if width % head_dim:
        return []
    setattr(new, heads[0], width // head_dim)
    return [heads[0]]


def _with_head_dim(model: nn.Module, new: Any, derived: dict[str, dict[str, int]],
                   read: frozenset[str]) -> bool:
    """Where the config has no ``head_dim`` field and derives one the attention does not
    have: give ``new`` a ``head_dim`` attribute, kept (``True``) if the model built from it
    then holds what the resized model holds (families that read
    ``getattr(config, "head_dim", ...)``)."""
    values = set(derived["head_dim"].values())
    if len(values) != 1:
        return False
    new.head_dim = values.pop()
    if _differences(model, new, read):
        delattr(new, "head_dim")
        return False
    return True


def _probed_fields(prober: _Prober, before: Any, sizes: Sizes, skip: set[str]
                   ) -> dict[str, dict[str, int]]:
    """The other int fields of the config (not in :data:`FIELDS`, not in ``skip``) whose value
    was the old length of a dimension the resize changed (DeBERTa's ``pooler_hidden_size``)
    and whose dims did change (:meth:`_Prober.follow`): candidates, which
    :func:`_differences` checks."""
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


def _attributes_differ(differences: Mapping[str, Mapping[str, Any]]) -> bool:
    """Whether ``differences`` (:func:`_differences`) holds an int attribute."""
    return any(not key.endswith(".shape") and any(
        type(v) is int for v in where.values()) for key, where in differences.items())


def _attribute_fields(prober: _Prober, before: Any, sizes: Sizes, skip: set[str]
                      ) -> dict[str, dict[str, int]]:
    """The int fields of the config (not in ``skip``) that set, when the model is built, a
    module attribute the resize changed as a member of a group (a router's ``num_group``,
    built from ``n_group``, where the experts drop whole routing groups), found by building
    the model with the field set to another value (:meth:`_Prober.attributes_following`):
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


def _companion_fields(model: nn.Module, before: Any, new: Any, changed: list[str],
                      skip: set[str], read: frozenset[str],
                      differences: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Fields (not in ``skip``) that held the same value as a field this update changed and
    that the resized forward still depends on through an int attribute it reads: DeepSeek's
    ``num_key_value_heads``, equal to ``num_attention_heads`` and sizing nothing but
    ``num_key_value_groups = heads // kv_heads``. Each is given the changed field's new value
    in ``new`` where the model built from the config then differs from the resized one in
    fewer int attributes (:func:`_differences`); only a candidate otherwise, left as it was."""
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
            left = _differences(model, new, read)
            fewer = sum(1 for key, where in left.items() if not key.endswith(".shape")
                        and any(type(v) is int for v in where.values()))
            if fewer < count and not any(k.endswith(".shape") for k in left if
                                         k not in differences):
                out.append(other)
                count = fewer
            else:
                setattr(new, other, value)
    return out


def _fields_read_by_name(model: nn.Module, new: Any, skip: set[str], read: frozenset[str],
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
        left = _differences(model, new, read)
        if left.keys() <= differences.keys() and places(left) < places(differences):
            out.append(attr)
            differences = left
        else:
            delattr(new, attr)
    return out


class _Prober:
    """Which parameter and buffer dims a config field sizes, found by building the model on
    the meta device from the config as it was before the resize and from a copy with the
    field set to another value: the dims that follow the field are the field's, whatever
    other fields hold the same number (``vocab_size == intermediate_size``)."""

    def __init__(self, model: nn.Module, before: Any) -> None:
        self.model = model
        self.before = before
        self._base: dict[str, tuple[int, ...]] | None = None
        self._now: dict[str, tuple[int, ...]] = {}
        self._built = False
        self._base_attributes: dict[str, dict[str, int]] | None = None
        self._base_model: nn.Module | None = None
        self._base_layouts: dict[str, tuple[int, int, int, int]] | None = None
        self._probes: dict[tuple[str, int], nn.Module | None] = {}

    def _base_build(self) -> nn.Module | None:
        """The model built from the config before the resize on the meta device (once)."""
        if self._base_model is None:
            self._base_model = meta_build(self.model, self.before)
        return self._base_model

    def base_layouts(self) -> dict[str, tuple[int, int, int, int]]:
        """:func:`.attention.current_layout` of every attention module of the model built
        from the config before the resize; empty if it cannot be built."""
        if self._base_layouts is None:
            built = self._base_build()
            self._base_layouts = {} if built is None else _attention_layouts(built)
        return self._base_layouts

    def _probe_shapes(self, field: str, old: int | None) -> dict[str, tuple[int, ...]] | None:
        """The parameter and buffer shapes of the model built with ``field`` set to three
        times ``old`` (the shapes of the old config and of the resized model read once);
        ``None`` if ``old`` is not a size or the model cannot be built on meta."""
        if not self._built:
            self._built = True
            built = self._base_build()
            self._base = None if built is None else tensor_shapes(built)
            self._now = tensor_shapes(self.model)
        if self._base is None or not old:
            return None
        built = self.probe_build(field, old)
        return None if built is None else tensor_shapes(built)

    def probe_build(self, field: str, old: int) -> nn.Module | None:
        """The model built on the meta device from the config before the resize with
        ``field`` set to three times ``old`` (once per field)."""
        if (field, old) not in self._probes:
            probe = copy.deepcopy(self.before)
            setattr(probe, field, 3 * old)
            self._probes[(field, old)] = meta_build(self.model, probe)
        return self._probes[(field, old)]

    def follow(self, field: str, old: int | None) -> dict[str, int] | None:
        """``{where: length now}`` at each dim ``field`` (of value ``old``) sizes: ``where``
        is the owning module, or ``"<tensor>:<dim>"`` where one module's dims differ;
        ``None`` if the model cannot be built on the meta device from the config."""
        shapes = self._probe_shapes(field, old)
        if shapes is None or self._base is None or not old:
            return None
        where: dict[str, dict[str, int]] = {}
        for name, shape in self._base.items():
            other, current = shapes.get(name), self._now.get(name)
            if other is None or current is None or not len(other) == len(shape) == len(
                    current):
                continue
            for d, (a, b) in enumerate(zip(shape, other, strict=True)):
                if a == old and b == 3 * old:
                    owner = name.rpartition(".")[0]
                    where.setdefault(owner, {})[f"{name}:{d}"] = current[d]
        found: dict[str, int] = {}
        for owner, dims in where.items():
            if len(set(dims.values())) == 1:
                found[owner] = next(iter(dims.values()))
            else:
                found.update(dims)
        return found


    def follow_units(self, field: str, old: int | None) -> dict[str, int] | None:
        """``{module: count now}`` for a field that counts whole units of the dims it sizes
        (DeepSeek's ``num_attention_heads``: ``q_b_proj`` has ``heads * qk_head_dim`` rows
        and no head count attribute the forward reads): the dims that are a multiple of
        ``old`` and grow with the field in proportion, read in the resized model in those
        units; ``None`` where the model cannot be built or the units are not whole."""
        shapes = self._probe_shapes(field, old)
        if shapes is None or self._base is None or not old:
            return None
        found: dict[str, set[int]] = {}
        for name, shape in self._base.items():
            other, current = shapes.get(name), self._now.get(name)
            if other is None or current is None or not len(other) == len(shape) == len(
                    current):
                continue
            for a, b, now in zip(shape, other, current, strict=True):
                if a % old == 0 and b == 3 * a and a != b:
                    unit = a // old
                    if now % unit:
                        return None
                    found.setdefault(name.rpartition(".")[0], set()).add(now // unit)
        if any(len(v) != 1 for v in found.values()):
            return None
        return {owner: v.pop() for owner, v in found.items()}

    def attributes_following(self, field: str, old: int) -> set[tuple[str, str]]:
        """The ``(module qualname, attribute)`` int attributes that hold ``field``'s value
        (``old``) when the model is built from the config, and follow it when the field
        changes."""
        if self._base_attributes is None:
            self._base_attributes = _meta_modules(self.model, self.before) or {}
        probe = copy.deepcopy(self.before)
        setattr(probe, field, 3 * old)
        other = _meta_modules(self.model, probe)
        if other is None:
            return set()
        return {(name, attr) for name, attrs in self._base_attributes.items()
                for attr, value in attrs.items()
                if value == old and other.get(name, {}).get(attr) == 3 * old}

    def set_attributes(self, field: str, old: int | None, found: Mapping[str, int]) -> None:
        """Set the int attributes of the model's modules that follow ``field`` when the model
        is built (``experts.num_experts``, which a ``grouped_mm`` experts kernel reads at run
        time but the traced one does not) to the length now of the dims that follow the
        field inside that module (``found``, from :meth:`follow`), where those agree."""
        if not old or not found:
            return
        probe = copy.deepcopy(self.before)
        setattr(probe, field, 3 * old)
        if self._base_attributes is None:
            self._base_attributes = _meta_modules(self.model, self.before) or {}
        base, other = self._base_attributes, _meta_modules(self.model, probe)
        if other is None:
            return
        lengths = {where.partition(":")[0].rpartition(".")[0] if ":" in where else where: n
                   for where, n in found.items()}
        modules = dict(self.model.named_modules())
        for name, attrs in base.items():
            mod = modules.get(name)
            if mod is None:
                continue
            inside = {n for owner, n in lengths.items()
                      if owner == name or owner.startswith(f"{name}.") or not name}
            if len(inside) != 1:
                continue
            now = inside.pop()
            for attr, value in attrs.items():
                state: dict[str, Any] = mod.__dict__  # restored by the transaction
                if value == old and other.get(name, {}).get(attr) == 3 * old and isinstance(
                        state.get(attr), int) and state[attr] != now:
                    state[attr] = now


def meta_build(model: nn.Module, config: Any) -> nn.Module | None:
    """A model of ``model``'s class built from ``config`` on the meta device: a transformers
    config object is passed to the class, a mapping (a diffusers config) to its
    ``from_config``. ``None`` if it cannot be built (a config the class's own checks refuse,
    or a class that cannot be built on meta). The probes of every config module (fields,
    depth, diffusers fields) build with this.

    Inside a run of the workflow (:func:`fxsym.memo.remembering`: a checkpoint prune, a
    search) a config equal to one built before in the run (the class, the default dtype and
    the config's pickled state alike) gives the model built then: a search probes the same
    few configs for every candidate. The model may be shared, so callers read it and never
    change it."""
    return remembered("meta_build", _build_key(model, config),
                      lambda: _meta_build(model, config))


def _build_key(model: nn.Module, config: Any) -> Hashable | None:
    """What a meta build reads: the class, the default dtype and the config's state; ``None``
    (never remembered) where the config cannot be pickled."""
    try:
        state = pickle.dumps(dict(config) if isinstance(config, Mapping) else config)
    except Exception:  # a config holding something pickle refuses: built every time
        return None
    return (type(model), torch.get_default_dtype(), state)


def _meta_build(model: nn.Module, config: Any) -> nn.Module | None:
    try:
        with torch.device("meta"), no_meta_init(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            built = (type(model).from_config(dict(config))  # type: ignore[attr-defined]
                     if isinstance(config, Mapping) else type(model)(config))
    except Exception:  # a config the class refuses, or a class that cannot be built on meta
        return None
    return built if isinstance(built, nn.Module) else None


def _meta_modules(model: nn.Module, config: Any) -> dict[str, dict[str, int]] | None:
    """The int attributes of every module of :func:`meta_build`'s model, by module
    qualname; ``None`` if it cannot be built."""
    fresh = meta_build(model, config)
    if fresh is None:
        return None
    return {name: {k: v for k, v in vars(mod).items() if type(v) is int and not k.startswith(
        "_")} for name, mod in fresh.named_modules()}


def tensor_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """Every parameter and buffer of ``model`` by qualified name (each place of a shared
    one): its shape."""
    named = [*model.named_parameters(remove_duplicate=False),
             *model.named_buffers(remove_duplicate=False)]
    return {name: tuple(t.shape) for name, t in named}


def meta_shapes(model: nn.Module, config: Any) -> dict[str, tuple[int, ...]] | None:
    """:func:`tensor_shapes` of :func:`meta_build`'s model; ``None`` if it cannot be built."""
    fresh = meta_build(model, config)
    return None if fresh is None else tensor_shapes(fresh)


def _attention_layouts(model: nn.Module) -> dict[str, tuple[int, int, int, int]]:
    out: dict[str, tuple[int, int, int, int]] = {}
    for name, mod in model.named_modules():
        layout = current_layout(mod)
        if layout is not None:
            out[name] = layout
    return out


def _old_value(config: Any, field: str | None) -> int | None:
    value = getattr(config, field, None) if field else None
    return value if isinstance(value, int) else None


def _derived_mlp(config: Any) -> int | None:
    """Four times the hidden size: the MLP width GPT-2 and its relatives derive from an
    intermediate field left ``None``."""
    hidden_fields = size_fields(config, FIELDS["hidden_size"])
    hidden = _old_value(config, hidden_fields[0] if hidden_fields else None)
    return None if hidden is None else 4 * hidden


def _mlp_sizes(model: nn.Module, config: Any, field: str, sizes: Sizes,
               attention: Mapping[str, Any]) -> dict[str, int]:
    """The intermediate width, now, of every projection outside attention that mapped the
    hidden size to ``field``'s value before the resize (its output features) or that value
    back to the hidden size (its input features); ``None`` stands for four times the hidden
    size, as GPT-2 and its relatives derive it."""
    hidden_fields = size_fields(config, FIELDS["hidden_size"])
    hidden = _old_value(config, hidden_fields[0] if hidden_fields else None)
    if hidden is None:
        return {}
    inter = _old_value(config, field)
    inter = 4 * hidden if inter is None else inter
    scope = _scope(field)
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


def _derived_mismatches(config: Any, attention: Mapping[str, tuple[int, int, int, int]]
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
        stack = [f for f in heads if _scope(f) is None or _scope(f) in q.split(".")]
        n_heads = _old_value(config, stack[0]) if stack else None
        width = _old_value(config, hidden[0])
        if n_heads and width and width // n_heads != hd:
            out = {"head_dim": {q2: lay[3] for q2, lay in attention.items()}}
            break
    return out


def attributes_read(symmap: Any) -> frozenset[str]:
    """The qualified names of the module attributes the model's ``forward`` is known to read:
    the ``get_attr`` targets of the traced graph (parameters, buffers, the int attributes read
    as sizes) and the attributes each leaf's SymInfo declares (a leaf's ``num_heads``)."""
    read: set[str] = set()
    graph = getattr(symmap, "graph", None)  # not graph_module: that generates its code
    if graph is not None:
        read.update(str(n.target) for n in graph.nodes if n.op == "get_attr")
    if hasattr(symmap, "named_modules"):
        for name, mod in symmap.named_modules():
            read.update(f"{name}.{attr}".lstrip(".")
                        for attr in symmap.sym_info(mod).attributes)
    return frozenset(read)


def _read_fields(read: frozenset[str]) -> set[str]:
    """The config fields a traced ``forward`` reads at run time (``attn.config.num_heads``):
    changing one changes what the resized model computes, so only the resize itself may."""
    return {f".{t}".rpartition(".config.")[2] for t in read if f".{t}".count(".config.") == 1}


def _differences(model: nn.Module, config: Any, read: frozenset[str] = frozenset()
                 ) -> dict[str, dict[str, Any]]:
    """What a model of ``model``'s class built from ``config`` (on the meta device, no
    weights) holds differently from ``model``: ``{name: {module qualname: value in model}}``
    for float attributes (a ``scaling`` of ``1/sqrt(head_dim)`` computed from the old
    ``head_dim``), for int and int-tuple attributes the traced ``forward`` reads (``read``:
    T5's ``model_dim`` in its output scale; one a resize leaves stale and nothing reads, such
    as ``mlp.intermediate_size``, does not count), and for parameter and buffer shapes
    (``"<name>.shape"``); empty if it cannot be built."""
    try:
        with torch.device("meta"):
            fresh = type(model)(config)
    except Exception:  # a class that cannot be built on meta: nothing to compare with
        return {}
    return differences_from(model, fresh, read)


def differences_from(model: nn.Module, fresh: nn.Module, read: frozenset[str] = frozenset()
                     ) -> dict[str, dict[str, Any]]:
    """What ``fresh`` (a model of ``model``'s class built from a config on the meta device)
    holds differently from ``model``, as :func:`_differences` says."""
    out: dict[str, dict[str, Any]] = {}
    built = dict(fresh.named_modules())
    for name, mod in model.named_modules():
        other = built.get(name)
        if other is None:
            continue
        theirs = vars(other)
        for attr, value in vars(mod).items():
            if attr.startswith("_"):
                continue
            if isinstance(value, float):
                if not isinstance(theirs.get(attr), float) or abs(theirs[attr] - value) > (
                        1e-6 * max(1.0, abs(value))):
                    out.setdefault(attr, {})[name] = value
            elif (isinstance(value, (int, tuple)) and f"{name}.{attr}".lstrip(".") in read
                  and theirs.get(attr) != value):
                out.setdefault(attr, {})[name] = value
        tensors = dict(other.named_parameters(recurse=False))
        tensors.update(other.named_buffers(recurse=False))
        for pname, t in [*mod.named_parameters(recurse=False),
                         *mod.named_buffers(recurse=False)]:
            if pname in tensors and tensors[pname].shape != t.shape:
                out.setdefault(f"{pname}.shape", {})[name] = list(t.shape)
    return out
