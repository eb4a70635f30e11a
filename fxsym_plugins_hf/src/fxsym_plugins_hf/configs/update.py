"""``model.config`` after :func:`fxsym.resize` (:func:`update_config`, the
``fxsym_after_resize`` hook): the steps, in order. The sizes are measured
(:mod:`.measuring`), each field set where the size is alike in every module; the fields
beyond those found and confirmed (:mod:`.inferred`); the config checked against a model built
from it (:func:`.builds.config_differences`) and against the class's own checks; what it
cannot describe recorded in :data:`.fields.NONUNIFORM` with a :class:`fxsym.ResizeWarning`
(:mod:`.reasons`); the copy given to every module holding the old config.

Imports from the plugin: configs.builds, configs.fields, configs.inferred, configs.measuring,
configs.prober, configs.reasons.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

from torch import nn

from fxsym import ResizeWarning

from .builds import attention_layouts, config_accepted, config_differences
from .fields import FIELDS, NONUNIFORM, UNPRUNED, Sizes, read_fields, size_fields
from .inferred import (
    attribute_fields,
    attributes_differ,
    companion_fields,
    fields_read_by_name,
    heads_of_pinned_head_dim,
    probed_fields,
    take_probed,
    with_head_dim,
)
from .measuring import config_before, derived_mismatches, measure
from .prober import Prober
from .reasons import undescribed, weights_fit


def update_config(model: nn.Module, sizes: Sizes, read: frozenset[str] = frozenset()) -> None:
    """Give ``model`` (and every module sharing its config) a copy of its config describing
    the resized model; ``sizes`` is the ``fxsym_after_resize`` argument, ``read`` the
    qualified names of the attributes the traced ``forward`` reads (:func:`attributes_read`)."""
    config = getattr(model, "config", None)
    if not sizes or config is None or not hasattr(config, "to_dict"):
        return
    attention = attention_layouts(model)
    memo: dict[int, Any] = {}
    new = copy.deepcopy(config, memo)
    before, changed = config_before(model, config, sizes)
    if UNPRUNED not in vars(model):  # before fxsym's first resize (fields it wrote put back)
        vars(model)[UNPRUNED] = copy.deepcopy(before)
    prober = Prober(model, before)
    written = frozenset(changed)  # read by the resized model's own forward: never reverted
    nonuniform: dict[str, dict[str, int]] = {}
    measured: list[str] = []
    for what, names in FIELDS.items():
        for field in size_fields(before, names):
            found = measure(model, before, what, field, sizes, attention, prober)
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
        changed += heads_of_pinned_head_dim(before, new, changed, measured + changed)
    derived = derived_mismatches(new, attention)
    if not (derived and not nonuniform and with_head_dim(model, new, derived, read)):
        nonuniform.update(derived)
    for field in read_fields(read) - written:  # the resized forward reads it as it is now
        if getattr(new, field, None) != getattr(config, field, None):
            setattr(new, field, getattr(config, field))
    if not nonuniform:  # the config claims to describe the model: check the claim
        differences = config_differences(model, new, read)
        if any(key.endswith(".shape") for key in differences):  # fields of other names?
            known = {f for names in FIELDS.values() for f in size_fields(before, names)}
            skip = known | set(changed) | read_fields(read)
            take_probed(probed_fields(prober, before, sizes, skip), before, new, changed,
                         nonuniform)
            if not nonuniform:
                differences = config_differences(model, new, read)
        if attributes_differ(differences):  # int attributes read: set by other fields?
            skip = set(changed) | read_fields(read)
            take_probed(attribute_fields(prober, before, sizes, skip), before, new, changed,
                         nonuniform)
            if not nonuniform:
                differences = config_differences(model, new, read)
        if not nonuniform and attributes_differ(differences):
            skip = set(changed) | read_fields(read)
            for field in companion_fields(model, before, new, changed, skip, read,
                                           differences):
                changed.append(field)
            differences = config_differences(model, new, read)
        if not nonuniform and attributes_differ(differences):
            skip = set(vars(before)) | read_fields(read)
            for field in fields_read_by_name(model, new, skip, read, differences):
                changed.append(field)
            differences = config_differences(model, new, read)
        nonuniform.update(differences)
    if not nonuniform and not config_accepted(new):  # alike everywhere, but not as the class allows
        nonuniform = {field: {"": getattr(new, field)} for field in changed}
    if nonuniform:
        why = undescribed(model, before, new, changed, nonuniform)
        setattr(new, NONUNIFORM, nonuniform)
        fits = weights_fit(model, new)
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
