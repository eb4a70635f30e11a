"""What a model's own description can follow (``describable=True``): the plugins'
``fxsym_undescribed_groups`` answers, as the groups to keep whole and the steps others keep.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import nn

from ...plugins.calls import call_hook
from ...plugins.contracts import Undescribed, undescribed
from ...symbols import SymMap, combine_step


def described(model: nn.Module, symmap: SymMap
              ) -> tuple[dict[str, str], dict[str, tuple[int, str]]]:
    """What the model's own description can follow, from every plugin's
    ``fxsym_undescribed_groups``: ``{group name: why it could not follow the group}``, and
    ``{group name: (units, why)}`` for the groups it describes only in steps of so many units
    (entries over the group's unit)."""
    whole: dict[str, str] = {}
    steps: dict[str, tuple[int, str]] = {}
    units = {g.name: g.unit for g in symmap.groups()}
    answers: list[Mapping[str, Undescribed] | None] = call_hook(
        "fxsym_undescribed_groups", model=model, symmap=symmap)
    for found in answers:
        for name, said in (found or {}).items():
            if name not in units:
                continue
            said = undescribed(said)
            if said.step is None:
                whole.setdefault(name, said.reason)
            else:
                steps[name] = combine_step(steps.get(name, (1, "")), said.step, units[name],
                                           said.reason)
    return whole, steps
