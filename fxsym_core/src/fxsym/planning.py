"""``fxsym.plan``: which units of which groups to keep, as plain data.

A :class:`Plan` lists every searchable group of the model it was made for, with its size and,
for each group it shrinks, the units to keep (in increasing order); ``print(plan)`` shows its
:meth:`Plan.summary`. It is plain data
(:meth:`Plan.to_json` / :meth:`Plan.from_json`): applied to a freshly built model of the same
architecture it gives the same model, and :meth:`Plan.check` says precisely where a model does
not fit it (:class:`~fxsym.errors.PlanMismatchError`). :meth:`Plan.apply` resizes through
:func:`fxsym.resize`, so a plan is validated and applied all or nothing.

**Counts.** Parameters come from the :class:`~fxsym.paramlayout.ParamLayout` (each parameter's
shape once groups keep so many units, without resizing anything). MACs come from the traced
graph (``node.meta["val"]``): a call of a module holding parameters of two or more dims costs
each of their elements once per output position (the output's entries over its feature
dim), so a conv, a linear and the projections inside an attention leaf are counted and shrink
with the plan; an embedding (integer input) costs nothing; a ``matmul``/``bmm`` between
activations costs ``output entries x inner dim`` at its traced size, which a plan does not
reduce (the attention scores inside a leaf are not counted).

**Solving.** Each group's units are ranked by an importance criterion
(:mod:`fxsym.importance`). ``scope="uniform"`` removes the same fraction of every group;
``scope="global"`` removes the lowest units over all groups, each group's scores divided by
their mean so groups compare. A ``ratio`` is that fraction of units; ``target_params`` or
``target_macs`` is met by bisection on it: the plan is the smallest cut that reaches the target,
so it misses it by less than one rounding step. Kept sizes are rounded up to a multiple of
``round_to`` (never past the group's size), at least ``min_keep`` and at least the group's
own ``min_size`` (a router's ``topk`` over the experts needs ``k`` of them), then up to a
multiple of the group's own ``step`` (what the model's kernels take: transformers'
``grouped_mm`` experts need 16-byte strides; the groups a plan so shrinks are listed with
the reason in ``plan.extra["steps"]``), or the whole group; groups listed in
``exclude`` (names or ``fnmatch`` patterns), groups the criterion cannot score and groups of
one unit stay whole; groups tied by ``same_size`` keep as many units as each other.

Imports from fxsym: console, depth, embeddings, errors, importance, options, paramlayout,
plugins, resizing, symbols.
"""

from __future__ import annotations

import difflib
import fnmatch
import glob
import json
import math
import numbers
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import fx, nn

from .console import format_table
from .depth import block_importance, choose_blocks, renamed
from .embeddings import embedding_tables
from .errors import PlanError, PlanMismatchError
from .importance import CRITERIA, Criterion, criterion_by_name, unit_scores
from .options import check_amount_values
from .paramlayout import ParamLayout, layout
from .plugins.calls import call_hook
from .plugins.contracts import Undescribed, undescribed
from .resizing import resize
from .symbols import SymGroup, SymMap, combine_step

__all__ = ["DepthChoice", "GroupChoice", "Plan", "analysis_options", "count_macs", "described",
           "excluded_groups", "input_spec", "inputs_from_spec", "param_shapes", "plan",
           "strict_loads"]

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
    counts the parameters but the embedding tables (:mod:`fxsym.embeddings`), where the model
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


#: how deep :func:`strict_loads` lets arrays and objects nest (a plan needs 5)
MAX_JSON_DEPTH = 32


def strict_loads(text: str | bytes) -> Any:
    """``json.loads`` for a file from a stranger: ``ValueError`` for text that is not UTF-8
    JSON, ``NaN``/``Infinity`` or a number out of float range (``1e400``), a key repeated in
    an object, or nesting deeper than :data:`MAX_JSON_DEPTH` (also where Python's own
    recursion limit is met first)."""
    def constant(name: str) -> Any:
        raise ValueError(f"{name} is not a JSON number")

    def finite(literal: str) -> float:
        value = float(literal)
        if not math.isfinite(value):
            raise ValueError(f"the number {literal:.40} is out of range")
        return value

    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                raise ValueError(f"the key {k!r:.40} appears twice in one object")
            out[k] = v
        return out

    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        value = json.loads(text, parse_constant=constant, parse_float=finite,
                           object_pairs_hook=unique)
    except RecursionError as exc:
        raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}") from exc
    level: list[Any] = [value]
    for _ in range(MAX_JSON_DEPTH + 1):
        level = [c for v in level if isinstance(v, (list, dict))
                 for c in (v.values() if isinstance(v, dict) else v)]
        if not level:
            return value
    raise ValueError(f"nested deeper than {MAX_JSON_DEPTH}")


def _class_path(model: nn.Module) -> str:
    cls = type(model)
    return f"{cls.__module__}.{cls.__qualname__}"


# -- example inputs as data -----------------------------------------------------------------
def input_spec(inputs: Any) -> Any:
    """Describe example inputs as JSON data: tensors by shape and dtype, JSON scalars as
    themselves; ``None`` when something else is among them."""
    def one(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return {"tensor": list(v.shape), "dtype": str(v.dtype).removeprefix("torch.")}
        if v is None or isinstance(v, (bool, int, float, str)):
            return {"value": v}
        raise TypeError(type(v).__name__)

    try:
        if isinstance(inputs, Mapping):
            return {"kwargs": {str(k): one(v) for k, v in inputs.items()}}
        if isinstance(inputs, (tuple, list)):
            return {"args": [one(v) for v in inputs]}
        return {"args": [one(inputs)]}
    except TypeError:
        return None


#: the most elements :func:`inputs_from_spec` makes, over all tensors (64 MiB of float32)
MAX_INPUT_ELEMENTS = 2**24
#: the dtypes an input spec may name, by the name :func:`input_spec` writes
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values()
           if isinstance(d, torch.dtype)}


def inputs_from_spec(spec: Any) -> Any:
    """Example inputs matching :func:`input_spec`'s description (random floats, integer
    zeros); ``None`` for ``None``. A description that is not :func:`input_spec`'s, or that
    asks for more than :data:`MAX_INPUT_ELEMENTS` elements in all, raises
    :class:`~fxsym.errors.PlanError` before anything is allocated."""
    if spec is None:
        return None
    try:
        shapes = _spec_shapes(spec)
    except ValueError as exc:
        raise PlanError(f"the plan's example inputs are not readable: {exc}") from exc
    total = sum(math.prod(shape) for shape in shapes)
    if total > MAX_INPUT_ELEMENTS:
        raise PlanError(f"the plan's example inputs ask for {total:,} elements, more than "
                        f"{MAX_INPUT_ELEMENTS:,}; pass example_inputs yourself")
    gen = torch.Generator().manual_seed(0)

    def one(v: dict[str, Any]) -> Any:
        if "value" in v:
            return v["value"]
        dtype = _DTYPES[v["dtype"]]
        if dtype.is_floating_point:
            return torch.randn(v["tensor"], generator=gen).to(dtype)
        return torch.zeros(v["tensor"], dtype=dtype)

    if "kwargs" in spec:
        return {k: one(v) for k, v in spec["kwargs"].items()}
    return tuple(one(v) for v in spec["args"])


def _spec_shapes(spec: Any) -> list[list[int]]:
    """Check that ``spec`` is what :func:`input_spec` writes (``ValueError`` naming what is
    not); return the shape of each tensor it describes."""
    d = _obj(spec, "inputs")
    if set(d) == {"kwargs"}:
        kw = _obj(d["kwargs"], "inputs.kwargs")
        odd = [k for k in kw if not k.isidentifier()]
        if odd:
            raise ValueError(f"inputs.kwargs: {odd[0]!r:.40} is not a parameter name")
        entries = [(f"inputs.kwargs[{k!r}]", v) for k, v in kw.items()]
    elif set(d) == {"args"}:
        entries = [(f"inputs.args[{i}]", v) for i, v in enumerate(_array(d["args"], "args"))]
    else:
        raise ValueError("inputs must hold 'args' or 'kwargs'")
    shapes: list[list[int]] = []
    for what, raw in entries:
        v = _obj(raw, what)
        if set(v) == {"value"}:
            if not (v["value"] is None or type(v["value"]) in (bool, int, float, str)):
                raise ValueError(f"{what}: a value must be a JSON scalar")
        elif set(v) == {"tensor", "dtype"}:
            shape = [_count(n, f"{what}: a size") for n in _array(v["tensor"], what)]
            if _text(v["dtype"], f"{what}: dtype") not in _DTYPES:
                raise ValueError(f"{what}: unknown dtype {v['dtype']!r:.40}")
            shapes.append(shape)
        else:
            raise ValueError(f"{what} must be {{'tensor', 'dtype'}} or {{'value'}}")
    return shapes


# -- strict reading of plan data: each field of its one JSON type ---------------------------
def _obj(v: Any, what: str) -> dict[str, Any]:
    if not isinstance(v, dict) or not all(isinstance(k, str) for k in v):
        raise ValueError(f"{what} must be a JSON object, got {type(v).__name__}")
    return v


def _array(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{what} must be a JSON array, got {type(v).__name__}")
    return v


def _text(v: Any, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{what} must be a string, got {v!r:.40}")
    return v


def _count(v: Any, what: str, low: int = 0) -> int:
    if type(v) is not int or v < low:
        raise ValueError(f"{what} must be an integer >= {low}, got {v!r:.40}")
    return v


def _key(v: Any, what: str) -> str | int:
    if type(v) is not int and not isinstance(v, str):
        raise ValueError(f"{what} must hold names or positions, got {v!r:.40}")
    return v


# -- MACs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _MacModel:
    """MACs as ``fixed + Σ positions x elements of its parameters``, over module calls:
    ``weights`` is, per parameter, the positions of all the calls using it."""

    fixed: int
    weights: Mapping[str, int]

    def count(self, shapes: Mapping[str, tuple[int, ...]]) -> int:
        return self.fixed + sum(w * math.prod(shapes[p]) for p, w in self.weights.items())


#: the targets of a product of two tensors (matmul and bmm, as functions, operators and methods)
MATMULS = frozenset({torch.matmul, torch.bmm, operator.matmul, "matmul", "bmm"})


def _mac_model(model: nn.Module, symmap: SymMap) -> _MacModel:
    graph = symmap.graph
    if graph is None:
        raise PlanError("the SymMap holds no traced graph; compute it with fxsym.analyze")
    names = {id(p): n for n, p in model.named_parameters()}
    modules = dict(model.named_modules())
    fixed = 0
    weights: dict[str, int] = {}
    for node in graph.nodes:
        out = _value(node)
        if out is None:
            continue
        if node.op == "call_module":
            mod = modules.get(str(node.target))
            if mod is None:
                continue
            params = [p for p in mod.parameters() if p.dim() >= 2 and id(p) in names]
            first = _value(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) \
                else None
            if not params or (first is not None and not first.is_floating_point()):
                continue  # nothing to multiply, or a lookup (an embedding)
            lead = params[0].shape[0]
            dims = [d for d in (1, -1) if out.dim() > max(d, -d - 1) and out.shape[d] == lead]
            feature = out.shape[dims[0]] if dims else (out.shape[-1] if out.dim() else 1)
            positions = out.numel() // max(int(feature), 1)
            for p in params:
                weights[names[id(p)]] = weights.get(names[id(p)], 0) + positions
        elif node.op in ("call_function", "call_method") and node.target in MATMULS:
            first = _value(node.args[0]) if node.args and isinstance(node.args[0], fx.Node) \
                else None
            if first is not None and first.dim():
                fixed += out.numel() * int(first.shape[-1])
    return _MacModel(fixed, weights)


def _value(node: Any) -> torch.Tensor | None:
    if not isinstance(node, fx.Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, (tuple, list)) and val:
        val = val[0]
    return val if isinstance(val, torch.Tensor) else None


def count_macs(model: nn.Module, symmap: SymMap, kept: Mapping[str, int] | None = None) -> int:
    """The MACs of one call of ``model`` on its traced example inputs, once each group of
    ``kept`` keeps that many units (see the module docstring for what is counted)."""
    lay = layout(model, symmap)
    return _mac_model(model, symmap).count(lay.shapes_after(kept or {}))


# -- planning -------------------------------------------------------------------------------
@dataclass
class _Candidate:
    group: SymGroup
    scores: torch.Tensor


def plan(
    model: nn.Module,
    symmap: SymMap,
    *,
    ratio: float | None = None,
    target_params: int | None = None,
    target_macs: int | None = None,
    importance: str | Criterion | Mapping[str, torch.Tensor] = "l2",
    scope: str = "global",
    round_to: int = 1,
    min_keep: int = 1,
    exclude: str | Iterable[str] = (),
    layers: Any = None,
    depth_importance: Any = None,
    sizes: Mapping[str, int] | None = None,
    describable: bool = False,
    target_non_embedding_params: int | None = None,
) -> Plan:
    """Choose the units to keep in each group of ``model`` (analyzed in ``symmap``).

    Exactly one of ``ratio`` (the fraction of units to remove, in ``[0, 1)``),
    ``target_params``, ``target_non_embedding_params`` (every parameter but the embedding
    tables, tied or not: :mod:`fxsym.embeddings`) or ``target_macs`` (counts to reach or go
    under) says how much.
    ``importance`` is a criterion of :mod:`fxsym.importance` (``"l1"``, ``"l2"``,
    ``"bn_scale"``, or a callable such as ``fxsym.importance.taylor(loss_fn, batches)``) or
    precomputed scores ``{group name: one score per unit}``. See the module docstring for
    ``scope``, ``round_to``, ``min_keep`` and ``exclude`` (one string is one pattern; a
    pattern matching no group is an error). Nothing is modified.

    ``layers`` drops blocks of the depth groups (:meth:`SymMap.depth_groups`): a count of
    blocks to keep, the positions to keep, or ``{depth group: either}`` (:mod:`fxsym.depth`);
    a count keeps the blocks ``depth_importance`` scores highest (``{depth group: scores}``,
    or a criterion such as ``fxsym.depth.block_importance(batches)``; by default block
    influence on the traced example inputs). With ``layers``, the width amount may be left
    out (depth only); ``target_params``/``target_macs`` count the model without the dropped
    blocks.

    ``describable=True`` keeps whole the groups the plugins say the model's own description
    could not follow (``fxsym_undescribed_groups``: a diffusers config with one field for
    sizes a resize cannot change), as ``exclude`` does, and rounds those it describes only in
    steps to them (a transformers config whose class checks ``hidden_size`` against the
    heads); the reasons are in ``plan.extra["undescribed"]`` and ``plan.extra["steps"]``. A
    uniform plan then gives a model its library saves and rebuilds with
    ``save_pretrained``/``from_pretrained``.

    ``sizes`` (``{group name: units to keep}``) is the width amount given group by group
    instead (the groups not named stay whole; :mod:`fxsym.search` derives it from a hidden
    size, an FFN width, head counts); it is rounded like the other amounts.

    Every argument is checked: a NaN, an infinity or a value of another type is a
    :class:`~fxsym.errors.PlanError` naming it, and so is a NaN or infinite score (it would
    rank its unit arbitrarily; the error names the group, the unit and the parameters holding
    non-finite weights there).
    """
    if (layers is not None or sizes is not None) and (
            ratio is None and target_params is None and target_macs is None
            and target_non_embedding_params is None):
        ratio = 0.0
    elif sizes is not None:
        raise PlanError("give sizes or one of ratio, target_params, "
                        "target_non_embedding_params and target_macs, not both")
    _check_amounts(ratio, target_params, target_macs, target_non_embedding_params)
    if not isinstance(scope, str) or scope not in ("global", "uniform"):
        raise PlanError(f"scope must be 'global' or 'uniform', got {scope!r}")
    check_amount_values(round_to=round_to, min_keep=min_keep)
    lay = layout(model, symmap)
    macs = _mac_model(model, symmap)
    tables = embedding_tables(model, symmap)
    counted = frozenset() if target_non_embedding_params is None else tables
    whole = sum(math.prod(v) for k, v in lay.shapes.items() if k not in tables)
    if target_non_embedding_params is not None and target_non_embedding_params > whole:
        raise PlanError(f"target_non_embedding_params {target_non_embedding_params:,} is above "
                        f"the model's {whole:,} non-embedding parameters: nothing to prune; "
                        f"give a target under {whole:,}")
    if target_params is not None and target_params > lay.param_count({}):
        raise PlanError(f"target_params {target_params:,} is above the model's "
                        f"{lay.param_count({}):,} parameters: nothing to prune; give a target "
                        f"under {lay.param_count({}):,}")
    groups = symmap.groups()
    depth_notes: list[str] = []
    blocks = _blocks_kept(model, symmap, layers, depth_importance, depth_notes)
    dropped = frozenset(n for n in lay.shapes
                        if renamed(n, symmap.depth_groups(), blocks) is None)
    patterns = _exclude_patterns(exclude, groups)
    undescribed, described_steps = described(model, symmap) if describable else ({}, {})
    patterns += [glob.escape(name) for name in undescribed]
    steps: dict[str, tuple[int, str]] = {}
    for g in groups:
        more, why = described_steps.get(g.name, (1, ""))
        steps[g.name] = combine_step((g.step, g.step_reason), more, 1, why)
    label, scores = _criterion_scores(model, symmap, importance, groups)
    candidates: list[_Candidate] = []
    for g in groups:
        if g.size <= max(min_keep, g.min_size) or any(
                fnmatch.fnmatchcase(g.name, p) for p in patterns):
            continue
        s = unit_scores(g, scores)
        if s is not None:
            _check_finite(model, lay, g, s, label)
            candidates.append(_Candidate(g, s))
    classes = _same_size_classes(groups)

    def kept_for(counts: Mapping[str, int]) -> dict[str, int]:
        out = {}
        for c in candidates:
            size, step = c.group.size, steps[c.group.name][0]
            least = max(min_keep, c.group.min_size)
            k = max(least, math.ceil(counts[c.group.name] / round_to) * round_to)
            out[c.group.name] = min(size, math.ceil(k / step) * step)
        for members in classes:  # blocks of one chunk keep as many units: the most of them,
            inside = [out.get(n) for n in members]  # all if one of them must stay whole
            top = max(lay.sizes[n] if k is None else k for n, k in zip(members, inside))
            for n in members:
                out[n] = min(top, lay.sizes[n])
        return out

    def uniform(r: float) -> dict[str, int]:
        return kept_for({c.group.name: math.ceil(c.group.size * (1 - r) - 1e-9)
                         for c in candidates})

    everyone = (_global_order(candidates) if scope == "global"
                else torch.zeros(0, dtype=torch.long))

    def global_(n: int) -> dict[str, int]:
        removed = torch.bincount(everyone[:n], minlength=len(candidates)).tolist()
        return kept_for({c.group.name: c.group.size - r for c, r in zip(candidates, removed)})

    def measure(kept: Mapping[str, int]) -> int:
        if target_macs is not None:
            return macs.count(_without(lay.shapes_after(kept), dropped))
        if dropped or counted:
            return sum(math.prod(v) for k, v in lay.shapes_after(kept).items()
                       if k not in dropped and k not in counted)
        return lay.param_count(kept)

    if sizes is not None:
        kept = kept_for(_given_sizes(sizes, groups, candidates))
    elif ratio is not None:
        kept = uniform(ratio) if scope == "uniform" else global_(int(ratio * len(everyone)))
    else:
        target = next(x for x in (target_params, target_non_embedding_params, target_macs)
                      if x is not None)
        what = ("MACs" if target_macs is not None else "non-embedding parameters" if counted
                else "parameters")
        if scope == "uniform":
            lo, hi = 0.0, 1.0
            if measure(uniform(hi)) > target:
                raise PlanError(_unreachable(what, target, measure(uniform(hi))))
            for _ in range(40):
                mid = (lo + hi) / 2
                lo, hi = (lo, mid) if measure(uniform(mid)) <= target else (mid, hi)
            kept = uniform(hi)
        else:
            lo_n, hi_n = 0, len(everyone)
            if measure(global_(hi_n)) > target:
                raise PlanError(_unreachable(what, target, measure(global_(hi_n))))
            while lo_n < hi_n:
                mid_n = (lo_n + hi_n) // 2
                if measure(global_(mid_n)) <= target:
                    hi_n = mid_n
                else:
                    lo_n = mid_n + 1
            kept = global_(hi_n)
    made = _make_plan(model, symmap, lay, macs, kept, {c.group.name: c.scores
                                                       for c in candidates}, label, scope)
    if undescribed:
        made = with_extra(made, undescribed=undescribed)
    stepped = {g.name: {"step": steps[g.name][0], "unit": g.unit, "why": steps[g.name][1]}
               for g in groups if steps[g.name][0] > 1 and kept.get(g.name, g.size) < g.size}
    if stepped:
        made = with_extra(made, steps=stepped)
    if tables:
        after = lay.shapes_after(kept)
        made = with_extra(made, non_embedding={
            "before": made.params_before - sum(math.prod(lay.shapes[t]) for t in tables),
            "after": made.params_after - sum(math.prod(after[t]) for t in tables)
            - sum(math.prod(after[n]) for n in dropped if n not in tables)})
    if depth_notes:
        made = with_extra(made, notes=[*(made.extra.get("notes") or ()), *depth_notes])
    return _with_depth(made, symmap, blocks, dropped, macs)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_amounts(ratio: Any, target_params: Any, target_macs: Any,
                   target_non_embedding_params: Any) -> None:
    """Exactly one amount, each a finite number in its range (a NaN compares false with
    everything: unchecked, a bisection on it ends at the smallest model)."""
    given = [x for x in (ratio, target_params, target_macs, target_non_embedding_params)
             if x is not None]
    if len(given) != 1:
        raise PlanError("give exactly one of ratio, target_params, target_non_embedding_params "
                        "and target_macs")
    check_amount_values(ratio=ratio, target_params=target_params, target_macs=target_macs,
                        target_non_embedding_params=target_non_embedding_params)


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


def excluded_groups(symmap: SymMap, exclude: str | Iterable[str]) -> frozenset[str]:
    """The names of the groups of ``symmap`` that ``exclude`` keeps whole (:func:`plan`'s
    ``exclude``: names or ``fnmatch`` patterns, one string is one pattern; a pattern matching
    no group is a :class:`~fxsym.errors.PlanError`)."""
    groups = symmap.groups()
    patterns = _exclude_patterns(exclude, groups)
    return frozenset(g.name for g in groups
                     if any(fnmatch.fnmatchcase(g.name, p) for p in patterns))


def _exclude_patterns(exclude: Any, groups: Sequence[SymGroup]) -> list[str]:
    """``exclude`` as a list of patterns (one string is one pattern), each matching a group."""
    patterns = [exclude] if isinstance(exclude, str) else exclude
    try:
        patterns = list(patterns)
    except TypeError:
        raise PlanError(f"exclude must be a group name or pattern, or a list of them; got "
                        f"{exclude!r}") from None
    names = [g.name for g in groups]
    for p in patterns:
        if not isinstance(p, str):
            raise PlanError(f"exclude holds {p!r}, not a group name or pattern")
        if not any(fnmatch.fnmatchcase(n, p) for n in names):
            near = difflib.get_close_matches(p, names, n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else \
                " (sizes that are not searchable groups are never pruned)"
            raise PlanError(f"exclude pattern {p!r} matches no group{hint}")
    return patterns


def _criterion_scores(model: nn.Module, symmap: SymMap, importance: Any,
                      groups: Sequence[SymGroup]) -> tuple[str, Mapping[str, Any]]:
    """The label and the scores of ``importance``: a criterion's name, a criterion, or
    scores given directly (every key a group)."""
    if isinstance(importance, str):
        label, scores = importance, criterion_by_name(importance)(model, symmap)
    elif callable(importance):
        label = getattr(importance, "__name__", "custom")
        scores = importance(model, symmap)
    elif isinstance(importance, Mapping):
        label, scores = "given", dict(importance)
    else:
        raise PlanError(f"importance must be a criterion's name ({', '.join(CRITERIA)}), a "
                        f"criterion or {{group name: scores}}; got a {type(importance).__name__}")
    if not isinstance(scores, Mapping):
        raise PlanError(f"the {label} importance returned a {type(scores).__name__}, not "
                        "{group name: scores}")
    names = {g.name for g in groups}
    unknown = [k for k in scores if k not in names]
    if unknown:
        near = difflib.get_close_matches(str(unknown[0]), list(names), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise PlanError(f"the {label} importance scores {unknown[0]!r}, which is not a group "
                        f"of the model{hint}")
    return label, scores


def _check_finite(model: nn.Module, lay: ParamLayout, group: SymGroup, scores: torch.Tensor,
                  label: str) -> None:
    """A NaN or infinite score would rank its unit arbitrarily (NaN compares false with
    everything; inf also makes the group's mean infinite): refuse it, naming the units and
    the parameters holding non-finite values there."""
    bad = (~torch.isfinite(scores)).nonzero().flatten()
    if not bad.numel():
        return
    units = f"unit {int(bad[0])}" + (f" (and {bad.numel() - 1} more)" if bad.numel() > 1 else "")
    params = dict(model.named_parameters())
    holders = []
    for s in lay.slices.get(group.name, ()):
        p = params.get(s.param)
        if p is None or p.device.type == "meta" or s.param in holders:
            continue
        rows = s.index[torch.isin(s.unit, bad)]
        if rows.numel() and not torch.isfinite(p.detach().index_select(s.dim, rows)).all():
            holders.append(s.param)
    verb = "holds" if len(holders) == 1 else "hold"
    where = f": {', '.join(holders)} {verb} NaN or inf there" if holders else ""
    raise PlanError(f"the {label} importance of group {group.name!r} is NaN or infinite for "
                    f"{units}{where}; repair the weights, leave the group whole "
                    f"(exclude={group.name!r}) or give finite scores")


def _unreachable(what: str, target: int, least: int) -> str:
    return (f"cannot reach {target} {what}: the smallest plan allowed (min_keep, round_to, "
            f"exclude, the groups the criterion scores) has {least}")


def _global_order(candidates: Sequence[_Candidate]) -> torch.Tensor:
    """The position in ``candidates`` of each unit's group, one per unit, lowest score first
    (scores divided by their group's mean); equal scores by unit index, then group name."""
    if not candidates:
        return torch.zeros(0, dtype=torch.long)
    by_name = sorted(range(len(candidates)), key=lambda j: candidates[j].group.name)
    name_rank = torch.empty(len(candidates), dtype=torch.long)
    name_rank[torch.tensor(by_name)] = torch.arange(len(candidates))
    values, units, owners = [], [], []
    for j, c in enumerate(candidates):
        mean = float(c.scores.mean())
        values.append(c.scores / mean if mean > 0 else c.scores)
        units.append(torch.arange(c.scores.numel()))
        owners.append(torch.full((c.scores.numel(),), j, dtype=torch.long))
    value, unit, owner = torch.cat(values), torch.cat(units), torch.cat(owners)
    order = torch.argsort(name_rank.index_select(0, owner), stable=True)
    for key in (unit, value):  # least significant first: stable sorts keep the earlier keys
        order = order.index_select(0, torch.argsort(key.index_select(0, order), stable=True))
    return owner.index_select(0, order)


def _same_size_classes(groups: Sequence[SymGroup]) -> list[list[str]]:
    classes: list[set[str]] = []
    for g in groups:
        tied = set(getattr(g, "same_size", ())) | {g.name}
        if len(tied) == 1:
            continue
        joined = [c for c in classes if c & tied]
        for c in joined:
            classes.remove(c)
            tied |= c
        classes.append(tied)
    return [sorted(c) for c in classes]


def _make_plan(model: nn.Module, symmap: SymMap, lay: ParamLayout, macs: _MacModel,
               kept: Mapping[str, int], scores: Mapping[str, torch.Tensor], label: str,
               scope: str) -> Plan:
    shapes_after = lay.shapes_after(kept)
    macs_before = macs.count(lay.shapes)
    params_before = lay.param_count({})
    choices = []
    for g in symmap.groups():
        k = kept.get(g.name, g.size)
        if k == g.size:
            choices.append(GroupChoice(g.name, g.size, g.unit))
            continue
        s = scores.get(g.name)
        top = torch.arange(k) if s is None else torch.topk(s, k, sorted=False).indices
        keep = tuple(top.sort().values.tolist())
        alone = lay.changed_shapes({g.name: k})
        choices.append(GroupChoice(
            g.name, g.size, g.unit, keep,
            sum(math.prod(lay.shapes[p]) - math.prod(shape) for p, shape in alone.items()),
            sum(macs.weights.get(p, 0) * (math.prod(lay.shapes[p]) - math.prod(shape))
                for p, shape in alone.items())))
    spec = input_spec(symmap.example_inputs)
    return Plan(model=_class_path(model), groups=tuple(choices), params_before=params_before,
                params_after=sum(math.prod(s) for s in shapes_after.values()),
                macs_before=macs_before, macs_after=macs.count(shapes_after),
                shapes=shapes_after, inputs=spec, outputs=symmap.output_contract,
                importance=label, scope=scope,
                extra={"analysis": dict(symmap.analysis_options)}
                if symmap.analysis_options else {})


def param_shapes(model: nn.Module, symmap: SymMap
                 ) -> Callable[[Mapping[str, int]], Mapping[str, tuple[int, ...]]]:
    """``shapes(sizes)``: every parameter's shape once the groups of ``sizes`` (``{group name:
    units kept}``) keep that many units, the others whole; the layout is learned once."""
    return layout(model, symmap).shapes_after


def _given_sizes(sizes: Mapping[str, int], groups: Sequence[SymGroup],
                 candidates: Sequence[_Candidate]) -> dict[str, int]:
    """``sizes`` checked (groups of the model, counts in range) over every candidate."""
    known = {g.name: g for g in groups}
    ranked = {c.group.name for c in candidates}
    for name, n in sizes.items():
        g = known.get(name)
        if g is None:
            raise PlanError(f"sizes names {name!r}, which is not a group of the model")
        if not _is_int(n) or not 1 <= n <= g.size:
            raise PlanError(f"sizes: {name!r} has {g.size} units; keep 1 to {g.size}, not {n!r}")
        if n < g.size and name not in ranked:
            raise PlanError(f"sizes: {name!r} cannot shrink here (excluded, too small for "
                            "min_keep, or the criterion cannot score it)")
    return {c.group.name: int(sizes.get(c.group.name, c.group.size)) for c in candidates}


def _blocks_kept(model: nn.Module, symmap: SymMap, layers: Any, importance: Any,
                 notes: list[str]) -> dict[str, list[int]]:
    """The blocks ``layers`` keeps, per depth group (:func:`fxsym.depth.choose_blocks`, a
    block of each kind the model needs kept: a swap that took is said in ``notes``)."""
    if layers is None:
        return {}
    counts = (layers.values() if isinstance(layers, Mapping) else [layers])
    scores = None
    if any(_is_int(c) for c in counts):
        if importance is None:
            importance = block_importance([symmap.example_inputs])
        scores = importance if isinstance(importance, Mapping) else importance(model, symmap)
    return choose_blocks(symmap, layers, scores, model=model, notes=notes)


def _without(shapes: Mapping[str, tuple[int, ...]], dropped: frozenset[str]
             ) -> dict[str, tuple[int, ...]]:
    """``shapes`` with the parameters of dropped blocks emptied (for the MAC model)."""
    return {k: (0,) if k in dropped else v for k, v in shapes.items()}


def _with_depth(p: Plan, symmap: SymMap, blocks: Mapping[str, list[int]],
                dropped: frozenset[str], macs: _MacModel) -> Plan:
    """``p`` dropping the blocks not in ``blocks``: shapes under their new names, counts
    without the dropped blocks' parameters."""
    if not blocks:
        return p
    groups = symmap.depth_groups()
    sizes = {g.name: g.size for g in groups}
    shapes = {renamed(k, groups, blocks): v for k, v in p.shapes.items() if k not in dropped}
    return replace(
        p, shapes={k: v for k, v in shapes.items() if k is not None},
        params_after=sum(math.prod(v) for k, v in shapes.items() if k is not None),
        macs_after=macs.count(_without(p.shapes, dropped)),
        depth=tuple(DepthChoice(n, sizes[n], tuple(k)) for n, k in blocks.items()))


def with_extra(p: Plan, **extra: Any) -> Plan:
    """``p`` with more entries in :attr:`Plan.extra` (JSON data)."""
    return replace(p, extra={**p.extra, **extra})



def analysis_options(p: Plan) -> dict[str, str]:
    """The options ``p``'s model was analyzed with (``extra["analysis"]``), as keyword
    arguments of :func:`fxsym.analyze`; a plan naming another option is a
    :class:`~fxsym.errors.PlanError` (its values are checked by ``analyze``)."""
    raw = p.extra.get("analysis") or {}
    if not isinstance(raw, Mapping) or any(
            k not in ("norm_groups", "routing_groups") or not isinstance(v, str)
            for k, v in raw.items()):
        raise PlanError(f"the plan names analysis options fxsym does not know: {raw!r}")
    return dict(raw)
