"""The lines ``fxsym prune`` prints beside the plan: the parameter target as given, what the
plan reached (every parameter and all but the embedding tables), and which of a checkpoint's
other files the output carries.
"""

from __future__ import annotations

from typing import Any

from ..request import Checked

#: what each kind of parameter target counts, as the output says it
_COUNTED = {"params": "parameters", "non_embedding": "non-embedding parameters",
            "active": "active parameters"}


def _target_kind(record: dict[str, Any]) -> str:
    """What a plan's ``extra["target"]`` counts."""
    return ("active" if record.get("active") else "non_embedding"
            if record.get("non_embedding") else "params")


def _asked(checked: Checked, plan: Any) -> tuple[int | None, str]:
    """The parameter count asked and what it counts (a ``--param-ratio`` of the model's
    parameters before the plan)."""
    count, kind = checked.target
    ratio = checked.request.param_ratio
    if ratio is not None:
        count = int(plan.params_before * (1 - ratio))
    return count, kind


def _target_text(checked: Checked, plan: Any) -> str:
    """The parameter target as given: ``117,792 parameters (--param-ratio 0.5 of 235,584)``."""
    record = plan.extra.get("target") or {}
    count, kind = _asked(checked, plan)
    count = record.get("params", count)
    text = f"{count:,} {_COUNTED[_target_kind(record) if record else kind]}"
    if checked.request.param_ratio is not None:
        text += f" (--param-ratio {checked.request.param_ratio} of {plan.params_before:,})"
    return text


def _reached_text(checked: Checked, plan: Any) -> str:
    """What a plan for a parameter target reached, beside the target it was given (empty
    without a target); both counts, every parameter and all but the embedding tables."""
    record = plan.extra.get("target")
    counts = plan.extra.get("non_embedding")
    count, kind = _asked(checked, plan)
    if not record and count is not None:  # a plan of widths to the target
        reached = (counts["after"] if kind == "non_embedding" and counts
                   else plan.params_after)
        record = {"params": count, "reached": reached, kind: True}
    if not record:
        return ""
    removed = 100 * (plan.params_before - plan.params_after) / max(plan.params_before, 1)
    also = "" if not counts else (
        f"; {100 * (counts['before'] - counts['after']) / max(counts['before'], 1):.1f}% of its "
        "non-embedding parameters")
    return (f"\n\ntarget: {_target_text(checked, plan)}; reached {record['reached']:,} "
            f"{_COUNTED[_target_kind(record)]} ({removed:.1f}% of the model's parameters "
            f"removed{also})")


def _carried_text(plan: Any) -> str:
    """The lines saying which of the input's other files the output carries and which it
    left out (``plan.extra`` of :func:`fxsym.prune_checkpoint`), each with why."""
    carried, left = plan.extra.get("carried") or [], plan.extra.get("left_out") or {}
    text = f"carried from the input: {', '.join(carried)}\n" if carried else ""
    if left:
        text += "left out: " + "; ".join(f"{n} ({why})" for n, why in left.items()) + "\n"
    return text
