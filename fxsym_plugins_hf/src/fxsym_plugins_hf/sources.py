"""What each group's size is read from (the ``fxsym_group_sources`` hook for transformers
models).

Equal numbers are not the same thing: Llama 4's shared expert is as wide as its routed
experts and narrower than its dense MLP, LFM2's short convolution is as wide as the hidden
size. What a width *is* shows in where the model reads it: the config field the modules are
built from. For each int field of the config (its own attributes, not ``attribute_map``
aliases), the model is built on the meta device from a copy with that field tripled; the
parameter dims whose length changed are the ones the field sizes (wholly, as Llama's
``intermediate_size``, or through a formula, as LFM2's ``block_ff_dim`` rounded to
``block_multiple_of``). A group's *source* is the fields changing a dim that holds its units
(its slices, :func:`fxsym.importance.layout`), joined by ``+`` in name order:
``"intermediate_size"``, ``"intermediate_size_mlp"``, ``"hidden_size"``. A field whose
changed config the class refuses, or that cannot be built on meta, says nothing; a model
that cannot be built on meta, or whose units are not slices of its parameters, has no
sources.

:func:`fxsym.search.roles` reads them: groups of one role read from different sources are
different width classes, and a group read from where the residual stream is read, as long as
it, is the hidden size again (no FFN width).
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from .configs import config_accepted, meta_shapes


def group_sources(model: nn.Module, symmap: Any) -> dict[str, str]:
    """``{group name: source}`` for the groups of ``symmap`` some config field of ``model``
    sizes (see the module docstring)."""
    from fxsym.errors import FxsymError
    from fxsym.prune.importance import layout

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict") or not config_accepted(config):
        return {}
    base = meta_shapes(model, config)
    if base is None:
        return {}
    try:
        where = layout(model, symmap).slices
    except FxsymError:  # units not in parameter slices (or a stale map): nothing to say
        return {}
    holders: dict[tuple[str, int], set[str]] = {}
    for group, slices in where.items():
        for s in slices:
            holders.setdefault((s.param, s.dim), set()).add(group)
    found: dict[str, set[str]] = {}
    for field, old in sorted(vars(config).items()):
        if field.startswith("_") or type(old) is not int or old < 1:
            continue
        probe = copy.deepcopy(config)
        try:
            setattr(probe, field, 3 * old)
        except Exception:  # a strict config refusing the value as it is set
            continue
        other = meta_shapes(model, probe)
        if other is None:
            continue
        for (param, dim), groups in holders.items():
            a, b = base.get(param), other.get(param)
            if a is not None and b is not None and len(a) == len(b) > dim and a[dim] != b[dim]:
                for g in groups:
                    found.setdefault(g, set()).add(field)
    return {g: "+".join(sorted(fields)) for g, fields in found.items()}
