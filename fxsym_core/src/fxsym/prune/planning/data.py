"""A plan as plain data: :class:`Plan`, its :class:`GroupChoice` and :class:`DepthChoice`.

A :class:`Plan` lists every searchable group of the model it was made for, with its size and,
for each group it shrinks, the units to keep (in increasing order); ``print(plan)`` shows its
:meth:`Plan.summary`. It is plain data
(:meth:`Plan.to_json` / :meth:`Plan.from_json`): applied to a freshly built model of the same
architecture it gives the same model, and :meth:`Plan.check` says precisely where a model does
not fit it (:class:`~fxsym.errors.PlanMismatchError`). :meth:`Plan.apply` resizes through
:func:`fxsym.resize`, so a plan is validated and applied all or nothing. :func:`with_extra`
adds entries to ``plan.extra``; :func:`analysis_options` reads the analysis options it
records.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from torch import nn

from ...errors import PlanError, PlanMismatchError
from ...plugins.analysis_options import declared_options
from ...resizing import resize
from ...symbols import SymMap
from ..console import format_table
from .inputs import _spec_shapes
from .strict import _array, _count, _key, _obj, _text, strict_loads

#: the version of :meth:`Plan.to_json`'s format
FORMAT = 1


@dataclass(frozen=True)
class GroupChoice:
    """One group of a plan: its size in units, the entries a unit spans, the units to keep
    (``None``: all of them) and what keeping only those would save on its own."""

    name: str
    size: int
    unit: int = 1
    keep: tuple[int, ...] | None = None
    params_removed: int = 0
    macs_removed: int = 0

    @property
    def kept(self) -> int:
        """How many units the plan keeps."""
        return self.size if self.keep is None else len(self.keep)


@dataclass(frozen=True)
class DepthChoice:
    """One depth group of a plan: its number of blocks and the blocks to keep, increasing."""

    name: str
    size: int
    keep: tuple[int, ...]


@dataclass(frozen=True)
class Plan:
    """Per searchable group of a model, the units to keep; counts before and after.

    ``model`` is the model's class (``module.QualName``); ``inputs`` describes the example
    inputs it was analyzed with (:func:`input_spec`) and ``outputs`` its output contract, so a
    fresh model can be analyzed the same way (with the analysis options in
    ``extra["analysis"]``, such as ``{"norm_groups": "keep"}``); ``shapes`` is every
    parameter's shape after the plan. ``extra["non_embedding"]`` (``{"before", "after"}``)
    counts the parameters but the embedding tables (:mod:`fxsym.prune.embeddings`), where the model
    has any.
    """

    model: str
    groups: tuple[GroupChoice, ...]
    params_before: int
    params_after: int
    macs_before: int
    macs_after: int
    shapes: Mapping[str, tuple[int, ...]]
    inputs: Any = None
    outputs: tuple[str | int, ...] | None = None
    importance: str = ""
    scope: str = "global"
    extra: Mapping[str, Any] = field(default_factory=dict)
    #: the depth groups the plan drops blocks of (``shapes`` are named as after the drop)
    depth: tuple[DepthChoice, ...] = ()

    # -- use ------------------------------------------------------------------------------
    def summary(self) -> str:
        """What the plan does, for a person: parameters and MACs before and after, then each
        group's size before and after and the parameters shrinking it alone would remove (what
        ``fxsym prune`` prints; ``str(plan)`` is this)."""
        def change(before: int, after: int) -> str:
            return f"{100 * (after - before) / before:+.1f}%" if before else "-"

        non_embedding = self.extra.get("non_embedding") or {}
        totals = format_table([
            ["parameters", f"{self.params_before:,}", f"{self.params_after:,}",
             change(self.params_before, self.params_after)],
            *([["non-embedding parameters", f"{non_embedding['before']:,}",
                f"{non_embedding['after']:,}",
                change(non_embedding["before"], non_embedding["after"])]]
              if non_embedding else []),
            ["MACs", f"{self.macs_before:,}", f"{self.macs_after:,}",
             change(self.macs_before, self.macs_after)]], ["", "before", "after", "change"])
        groups = format_table([[g.name, g.size, g.kept, f"{g.params_removed:,}"]
                               for g in self.groups],
                              ["group", "before", "after", "params removed alone"])
        text = f"{self.model}: {self.scope} {self.importance} plan\n\n{totals}\n\n{groups}"
        if self.depth:
            text += "\n\n" + format_table(
                [[d.name, d.size, len(d.keep), " ".join(map(str, d.keep))] for d in self.depth],
                ["depth group", "blocks before", "after", "blocks kept"])
        rounded: dict[tuple[int, str], list[str]] = {}
        for name, s in (self.extra.get("steps") or {}).items():
            rounded.setdefault((s["step"] * s["unit"], s["why"]), []).append(name)
        for (entries, why), names in rounded.items():
            more = f" and {len(names) - 2} more" if len(names) > 2 else ""
            text += (f"\n\nkept at a multiple of {entries} entries ({why}): "
                     f"{', '.join(names[:2])}{more}")
        for note in self.extra.get("notes") or ():
            text += f"\n\nnote: {note}"
        return text

    def __str__(self) -> str:
        return self.summary()

    def choices(self) -> dict[str, list[int]]:
        """``{group name: units to keep}`` for the groups the plan shrinks (what
        :func:`fxsym.resize` takes)."""
        out = {g.name: list(g.keep) for g in self.groups if g.keep is not None
               and len(g.keep) != g.size}
        out.update({d.name: list(d.keep) for d in self.depth if len(d.keep) != d.size})
        return out

    def check(self, model: nn.Module, symmap: SymMap) -> None:
        """Raise :class:`~fxsym.errors.PlanMismatchError` naming the first way ``model`` (as
        analyzed in ``symmap``) does not fit this plan; touch nothing."""
        kind = _class_path(model)
        if kind != self.model:
            raise PlanMismatchError(f"the plan is for a {self.model}, the model is a {kind}")
        if symmap.model is not model:
            raise PlanMismatchError("the SymMap was computed for another model")
        groups = {g.name: g for g in symmap.groups()}
        for choice in self.groups:
            group = groups.get(choice.name)
            if group is None:
                missing = choice.name.rpartition(".")[0]
                near = [n for n in groups if n.rpartition(".")[0] == missing]
                hint = (f" (module {missing!r} has no such group)" if near else
                        f" (no module {missing!r} with a searchable group: renamed or another "
                        "architecture?)")
                raise PlanMismatchError(f"group {choice.name!r} of the plan is not in the "
                                        f"model{hint}")
            if (group.size, group.unit) != (choice.size, choice.unit):
                raise PlanMismatchError(
                    f"group {choice.name!r} has {group.size} units of {group.unit} in the model, "
                    f"{choice.size} units of {choice.unit} in the plan")
            if choice.keep is not None:
                keep = list(choice.keep)
                bad = [i for i in keep if not 0 <= i < group.size]
                if bad:
                    raise PlanMismatchError(f"group {choice.name!r}: index {bad[0]} out of range "
                                            f"[0, {group.size})")
                if not keep or len(set(keep)) != len(keep):
                    raise PlanMismatchError(f"group {choice.name!r}: the units to keep must be "
                                            "distinct and at least one")
        depth = {g.name: g for g in symmap.depth_groups()}
        for d in self.depth:
            found = depth.get(d.name)
            if found is None or found.size != d.size:
                has = "no such depth group" if found is None else f"{found.size} blocks"
                raise PlanMismatchError(f"depth group {d.name!r} of the plan has {d.size} "
                                        f"blocks; the model: {has}")
            if not d.keep or list(d.keep) != sorted(set(d.keep)) or not all(
                    0 <= i < d.size for i in d.keep):
                raise PlanMismatchError(f"depth group {d.name!r}: the blocks to keep must be "
                                        f"distinct, increasing, in [0, {d.size})")
        planned = {g.name for g in self.groups}
        extra = [n for n in groups if n not in planned]
        if extra:
            raise PlanMismatchError(f"the model has group {extra[0]!r}, which the plan does "
                                    "not know (another architecture?)")

    def apply(self, model: nn.Module, symmap: SymMap) -> nn.Module:
        """Check the plan against ``model`` (:meth:`check`) and resize it (through
        :func:`fxsym.resize`: all or nothing). ``symmap`` is stale afterwards."""
        self.check(model, symmap)
        choices = self.choices()
        if choices:
            resize(model, symmap, choices)
        return model

    # -- plain data -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The plan as JSON-compatible data."""
        return {
            "format": FORMAT,
            "model": self.model,
            "importance": self.importance,
            "scope": self.scope,
            "params": {"before": self.params_before, "after": self.params_after},
            "macs": {"before": self.macs_before, "after": self.macs_after},
            "inputs": self.inputs,
            "outputs": None if self.outputs is None else list(self.outputs),
            "groups": [{"name": g.name, "size": g.size, "unit": g.unit,
                        "keep": None if g.keep is None else list(g.keep),
                        "params_removed": g.params_removed, "macs_removed": g.macs_removed}
                       for g in self.groups],
            "shapes": {k: list(v) for k, v in self.shapes.items()},
            "extra": dict(self.extra),
            "depth": [{"name": d.name, "size": d.size, "keep": list(d.keep)}
                      for d in self.depth],
        }

    def to_json(self, indent: int | None = 1) -> str:
        """The plan as JSON text (:meth:`from_json` reads it back)."""
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, data: Any) -> Plan:
        """Read :meth:`to_dict`'s data; :class:`~fxsym.errors.PlanError` naming the first field
        that is not what :meth:`to_dict` writes.

        Strict, as for a file from a stranger: each field has its one JSON type (an integer is
        never a float, a string or a bool: ``"keep": "0123456"`` or a size of ``16.9`` is an
        error, not 7 units or 16), counts, sizes and indices are not negative, a group is
        listed once, and the example inputs are checked as :func:`inputs_from_spec` checks
        them. Whether the indices fit the model is :meth:`check`'s question."""
        try:
            d = _obj(data, "the plan")
            if type(d.get("format")) is not int or d["format"] != FORMAT:
                raise ValueError(f"not an fxsym plan of format {FORMAT}")
            groups: list[GroupChoice] = []
            seen: set[str] = set()
            for i, raw in enumerate(_array(d.get("groups"), "groups")):
                g = _obj(raw, f"groups[{i}]")
                name = _text(g.get("name"), f"groups[{i}].name")
                if name in seen:
                    raise ValueError(f"group {name!r} is listed twice")
                seen.add(name)
                size = _count(g.get("size"), f"{name}: size", 1)
                keep = g.get("keep")
                if keep is not None:
                    keep = tuple(_count(k, f"{name}: keep[{j}]")
                                 for j, k in enumerate(_array(keep, f"{name}: keep")))
                groups.append(GroupChoice(
                    name, size, _count(g.get("unit", 1), f"{name}: unit", 1), keep,
                    _count(g.get("params_removed", 0), f"{name}: params_removed"),
                    _count(g.get("macs_removed", 0), f"{name}: macs_removed")))
            depth: list[DepthChoice] = []
            for i, raw in enumerate(_array(d.get("depth", []), "depth")):
                g = _obj(raw, f"depth[{i}]")
                name = _text(g.get("name"), f"depth[{i}].name")
                depth.append(DepthChoice(name, _count(g.get("size"), f"{name}: size", 1), tuple(
                    _count(k, f"{name}: keep[{j}]")
                    for j, k in enumerate(_array(g.get("keep"), f"{name}: keep")))))
            params, macs = _obj(d.get("params"), "params"), _obj(d.get("macs"), "macs")
            shapes = {_text(k, "a parameter name"): tuple(
                _count(n, f"shapes[{k!r}]") for n in _array(v, f"shapes[{k!r}]"))
                for k, v in _obj(d.get("shapes"), "shapes").items()}
            outputs = d.get("outputs")
            if outputs is not None:
                outputs = tuple(_key(o, "outputs") for o in _array(outputs, "outputs"))
            inputs = d.get("inputs")
            if inputs is not None:
                _spec_shapes(inputs)
            return cls(
                model=_text(d.get("model"), "model"), groups=tuple(groups),
                params_before=_count(params.get("before"), "params.before"),
                params_after=_count(params.get("after"), "params.after"),
                macs_before=_count(macs.get("before"), "macs.before"),
                macs_after=_count(macs.get("after"), "macs.after"),
                shapes=shapes, inputs=inputs, outputs=outputs,
                importance=_text(d.get("importance", ""), "importance"),
                scope=_text(d.get("scope", ""), "scope"),
                extra=dict(_obj(d.get("extra") or {}, "extra")), depth=tuple(depth))
        except ValueError as exc:
            raise PlanError(f"not a valid fxsym plan: {exc}") from exc

    @classmethod
    def from_json(cls, text: str | bytes) -> Plan:
        """Read :meth:`to_json`'s text (strict JSON: :func:`strict_loads`)."""
        try:
            data = strict_loads(text)
        except ValueError as exc:
            raise PlanError(f"not a valid fxsym plan: {exc}") from exc
        return cls.from_dict(data)


def _class_path(model: nn.Module) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


def with_extra(p: Plan, **extra: Any) -> Plan:
    """``p`` with more entries in :attr:`Plan.extra` (JSON data)."""
    return replace(p, extra={**p.extra, **extra})


def analysis_options(p: Plan) -> dict[str, str]:
    """The options ``p``'s model was analyzed with (``extra["analysis"]``), as keyword
    arguments of :func:`fxsym.analyze`; a plan naming an option no plugin declares
    (``fxsym_analysis_options``) is a :class:`~fxsym.errors.PlanError` (its values are
    checked by ``analyze``)."""
    raw = p.extra.get("analysis") or {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, str) for v in raw.values()) or (
            raw and not set(raw) <= set(declared_options())):
        raise PlanError(f"the plan names analysis options fxsym does not know: {raw!r}")
    return dict(raw)
