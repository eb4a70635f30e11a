"""Example inputs as data: :func:`input_spec` describes them (tensors by shape and dtype, JSON
scalars as themselves), :func:`inputs_from_spec` makes inputs matching a description, bounded
by :data:`MAX_INPUT_ELEMENTS` and checked before anything is allocated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from ...errors import PlanError
from .strict import _array, _count, _obj, _text


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
