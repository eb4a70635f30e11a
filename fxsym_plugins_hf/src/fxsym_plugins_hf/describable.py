"""The sizes a transformers config can describe (``fxsym_undescribed_groups`` for transformers
models).

A pruned model saves as a plain checkpoint of its family only if its config describes it
(:mod:`.configs`), and a config the class's own checks refuse cannot: Llama's
``validate_architecture`` wants ``hidden_size`` a multiple of ``num_attention_heads``, even
with ``head_dim`` given. So before planning, for each size field of the config
(:data:`.configs.FIELDS`), the values the class's checks accept are probed on a copy of the
config: the smallest accepted value ``m`` and a few of its multiples (``2m``, ``3m``, half and
all but one step of the current value). If every size is accepted there is nothing to say; if
the multiples of ``m`` are, the field takes steps of ``m``; otherwise the field cannot follow
a resize. The groups the field sizes are found by building the model on the meta device from
the config and from one with the field tripled: the parameter dims that triple are the
field's, and the groups with units in them (:func:`fxsym.importance.layout`) take the field's
step (``(m, reason)``: :func:`fxsym.plan` with ``describable=True`` rounds to it), or stay
whole (a reason).

A field can also set values the model computes from it when it is built and a resize keeps
(Gemma's embeddings are scaled by ``sqrt(hidden_size)``: ``scalar_embed_scale``, which its
``_init_weights`` copies into the ``embed_scale`` buffer after a load): the float attributes
of the two meta builds are compared, and the groups the field sizes stay whole, the reason
naming the value (transformers 5 keeps each value a non-persistent buffer is recomputed
from as such an attribute, since its loaders build on the meta device). A model built from
a config with that field changed would compute something else than the resized one, so the
config cannot describe the resize (:func:`.configs.update_config` finds the same value and
marks the config).

Only one field changes at a time: a plan that also removes heads can still break a check
that ties two fields (``hidden_size % num_attention_heads``); the config written after the
resize is checked again (:func:`.configs.update_config`), and such a model is saved as
fxsym's own model type.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from fxsym.plugins.contracts import Undescribed

from .configs import FIELDS, config_accepted, meta_build, size_fields, tensor_shapes

#: the most values probed below a field's current one to find the smallest accepted
_SCAN = 4096


def undescribed_groups(model: nn.Module, symmap: Any) -> dict[str, Undescribed]:
    """``{group name: Undescribed(reason, step=entries)}`` for the groups whose sizes
    ``model``'s config describes only in steps of ``entries``, ``{group name:
    Undescribed(reason)}`` for those it cannot describe changed (see the module docstring)."""
    from fxsym.prune.importance import layout

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict") or not config_accepted(config):
        return {}
    steps: dict[str, int | None] = {}
    for names in FIELDS.values():
        for field in size_fields(config, names):
            old = getattr(config, field)
            if isinstance(old, int) and old > 1 and field not in steps:
                steps[field] = _accepted_step(config, field, old)
    base_model = meta_build(model, config)
    if base_model is None:
        return {}
    base = tensor_shapes(base_model)
    declared = _declared(symmap)
    owners: dict[tuple[str, int], set[str]] = {}
    for group, slices in layout(model, symmap).slices.items():
        for s in slices:
            owners.setdefault((s.param, s.dim), set()).add(group)
    name = type(config).__name__
    out: dict[str, Undescribed] = {}
    for field, step in steps.items():
        old = getattr(config, field)
        tripled = copy.deepcopy(config)
        setattr(tripled, field, 3 * old)
        built = meta_build(model, tripled)
        if built is None:
            continue
        derived = _derived_floats(base_model, built, declared, old)
        if step == 1 and not derived:
            continue
        other = tensor_shapes(built)
        groups = {g for p, shape in base.items() if p in other
                  for d, (a, b) in enumerate(zip(shape, other[p], strict=False))
                  if a == old and b == 3 * old for g in owners.get((p, d), ())}
        for g in sorted(groups):
            if derived:
                where, (now, then) = next(iter(derived.items()))
                out[g] = Undescribed(
                    f"{where} is {now:.6g}, computed from {field} when a "
                    f"{type(model).__name__} is built ({then:.6g} with {field} tripled); a "
                    f"resize keeps it, so a config with another {field} would build a model "
                    "computing something else")
            elif step is None:
                out[g] = Undescribed(f"{name}'s own checks refuse some values of {field} "
                                     f"below {old}, not a step that a plan can round to")
            elif g not in out or out[g].step is not None:
                now_step = (out[g].step or 1) if g in out else 1
                out[g] = Undescribed(f"{name}'s own checks take {field} only in multiples of "
                                     f"{step}", step=max(now_step, step))
    return out


def _declared(symmap: Any) -> set[tuple[str, str]]:
    """``(module qualname, attribute)`` of every attribute a SymInfo declares (a resize
    updates those with the weights)."""
    if not hasattr(symmap, "named_modules"):
        return set()
    return {(name, attr) for name, mod in symmap.named_modules()
            for attr in symmap.sym_info(mod).attributes}


def _derived_floats(base: nn.Module, other: nn.Module, declared: set[tuple[str, str]],
                    old: int) -> dict[str, tuple[float, float]]:
    """``{"module.attr": (value in base, value in other)}``: the public float attributes of
    two builds of one class, the second from a field of value ``old`` tripled, that differ
    (values computed from the field), but those a resize updates (``declared``) and those of
    a module where another size moved with the field (Qwen2's ``head_dim``, ``hidden //
    heads``: the config update gives it a field of its own, and its ``scaling`` follows)."""
    built = dict(other.named_modules())
    out: dict[str, tuple[float, float]] = {}
    for qual, mod in base.named_modules():
        theirs = vars(built[qual]) if qual in built else {}
        mine = vars(mod)
        if any(type(v) is int and type(theirs.get(k)) is int and theirs[k] != v
               and (v, theirs[k]) != (old, 3 * old) for k, v in mine.items()):
            continue
        for attr, value in mine.items():
            if (not attr.startswith("_") and isinstance(value, float)
                    and (qual, attr) not in declared and isinstance(theirs.get(attr), float)
                    and abs(theirs[attr] - value) > 1e-6 * max(1.0, abs(value))):
                out[f"{qual}.{attr}".lstrip(".")] = (value, theirs[attr])
    return out


def _accepted_step(config: Any, field: str, old: int) -> int | None:
    """The step of the values of ``field`` below ``old`` that ``config``'s class accepts: 1
    for all, ``m`` for the multiples of ``m``, ``None`` for neither (or none found)."""
    probe = copy.deepcopy(config)

    def accepted(value: int) -> bool:
        try:
            setattr(probe, field, value)
        except Exception:  # a strict config refusing the value as it is set
            return False
        return config_accepted(probe)

    step = next((v for v in range(1, min(old, _SCAN) + 1) if accepted(v)), None)
    if step is None:
        return None
    count = old // step
    ok = all(accepted(k * step) for k in {2, 3, count // 2, count - 1} if 1 <= k * step < old)
    return step if ok else None
