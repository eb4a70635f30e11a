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

Only one field changes at a time: a plan that also removes heads can still break a check
that ties two fields (``hidden_size % num_attention_heads``); the config written after the
resize is checked again (:func:`.configs.update_config`), and such a model is saved as
fxsym's own model type.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from .configs import FIELDS, config_accepted, meta_shapes, size_fields

#: the most values probed below a field's current one to find the smallest accepted
_SCAN = 4096


def undescribed_groups(model: nn.Module, symmap: Any) -> dict[str, Any]:
    """``{group name: (entries, reason)}`` for the groups whose sizes ``model``'s config
    describes only in steps of ``entries``, ``{group name: reason}`` for those it cannot
    describe changed (see the module docstring)."""
    from fxsym.importance import layout

    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "to_dict") or not config_accepted(config):
        return {}
    steps: dict[str, int | None] = {}
    for names in FIELDS.values():
        for field in size_fields(config, names):
            old = getattr(config, field)
            if isinstance(old, int) and old > 1 and field not in steps:
                steps[field] = _accepted_step(config, field, old)
    probed = {f: s for f, s in steps.items() if s != 1}
    if not probed:
        return {}
    base = meta_shapes(model, config)
    if base is None:
        return {}
    owners: dict[tuple[str, int], set[str]] = {}
    for group, slices in layout(model, symmap).slices.items():
        for s in slices:
            owners.setdefault((s.param, s.dim), set()).add(group)
    name = type(config).__name__
    out: dict[str, Any] = {}
    for field, step in probed.items():
        old = getattr(config, field)
        tripled = copy.deepcopy(config)
        setattr(tripled, field, 3 * old)
        other = meta_shapes(model, tripled)
        if other is None:
            continue
        groups = {g for p, shape in base.items() if p in other
                  for d, (a, b) in enumerate(zip(shape, other[p], strict=False))
                  if a == old and b == 3 * old for g in owners.get((p, d), ())}
        for g in sorted(groups):
            if step is None:
                out[g] = (f"{name}'s own checks refuse some values of {field} below {old}, "
                          "not a step that a plan can round to")
            elif not isinstance(out.get(g), str):
                now = out.get(g, (1, ""))[0]
                out[g] = (max(now, step), f"{name}'s own checks take {field} only in "
                                          f"multiples of {step}")
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
