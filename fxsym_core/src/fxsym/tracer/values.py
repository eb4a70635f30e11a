"""Node values computed without running: what a value provably is, from the metadata of what
it is computed from.

Computing each node's value on the ``meta`` device runs torch's meta kernels, many of them in
Python (a convolution is ~0.1 ms of module call, argument checks and shape formula): a large
part of an analysis. The functions here give a value only where its metadata (shape, dtype,
strides, device) is provably what running gives, and ``None`` otherwise: the node is then
run as before, and raises as before when the model is wrong.

* :func:`op_value` is the tracer's own rule for a few common torch ops: pointwise ``add``,
  ``sub``, ``mul`` and true division of floating tensors of one dtype and Python numbers, and
  ``F.adaptive_avg_pool2d``;
* :func:`plain_float`, :func:`row_major`, :func:`nonempty` and :func:`meta_empty` are the
  pieces a family's value rule (``register(..., value=rule)``, see
  ``fxsym_register_sym_infos``) is made of.

The argument they rest on: torch's TensorIterator lays out the output of a pointwise op by
sorting the dimensions by the operands' strides; when every operand is row-major
(:func:`row_major`: the strides ``torch.empty`` gives its shape, no element missing) no
dimension ever moves, so the output is row-major too, of the broadcast shape. The tests
(``tests/test_value_rules.py``) compare each rule with running, over many configurations.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

#: the dtypes the rules accept: a floating tensor meets another of its dtype or a Python
#: number and gives its own dtype back
FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

_INT64 = (-(2**63), 2**63 - 1)


def plain_float(value: Any) -> bool:
    """``value`` is a plain ``torch.Tensor`` (no subclass) on the meta device, of a floating
    dtype of :data:`FLOATS`, not requiring grad."""
    return (type(value) is torch.Tensor and value.is_meta and value.dtype in FLOATS
            and not value.requires_grad)


def row_major(t: torch.Tensor) -> bool:
    """``t`` has the strides ``torch.empty(t.shape)`` gives (row-major, including the strides
    of dims of size 1) and at least one element."""
    expected = 1
    for size, stride in zip(reversed(t.shape), reversed(t.stride())):
        if size == 0 or stride != expected:
            return False
        expected *= size
    return True


def nonempty(t: torch.Tensor) -> bool:
    """No dim of ``t`` has size 0."""
    return all(size > 0 for size in t.shape)


#: ``torch.empty`` as imported (before any trace): while a model is traced, ``torch.empty``
#: is a wrapper recording calls given traced sizes (``_traced_factories``), ~40 us a call
_EMPTY = torch.empty


def meta_empty(shape: Sequence[int], dtype: torch.dtype) -> torch.Tensor:
    """A row-major meta tensor of ``shape`` and ``dtype``."""
    return _EMPTY(tuple(shape), dtype=dtype, device="meta")


def _number(value: Any) -> bool:
    kind = type(value)
    return kind is float or (kind is int and _INT64[0] <= value <= _INT64[1])


_POINTWISE_FUNCTIONS = frozenset({
    operator.add, operator.sub, operator.mul, operator.truediv,
    torch.add, torch.sub, torch.subtract, torch.mul, torch.multiply, torch.div,
    torch.divide, torch.true_divide,
})
_POINTWISE_METHODS = frozenset({"add", "sub", "subtract", "mul", "multiply", "div", "divide",
                                "true_divide"})


def pointwise_value(args: tuple[Any, ...]) -> torch.Tensor | None:
    """The value of ``a + b`` (or ``-``, ``*``, ``/``) for ``args == (a, b)``: row-major
    floating meta tensors of one dtype (0-d ones too) and Python ints and floats, at least one
    tensor; of the broadcast shape, row-major, that dtype. ``None`` otherwise (shapes that do
    not broadcast included: running raises)."""
    if len(args) != 2:
        return None
    dtype = None
    shapes = []
    for a in args:
        if type(a) is torch.Tensor:
            if not (plain_float(a) and row_major(a)) or (dtype is not None and a.dtype != dtype):
                return None
            dtype = a.dtype
            shapes.append(a.shape)
        elif not _number(a):
            return None
    if dtype is None:
        return None
    shape = _broadcast(shapes)
    return None if shape is None else meta_empty(shape, dtype)


def _broadcast(shapes: list[torch.Size]) -> list[int] | None:
    """The broadcast of shapes without empty dims (aligned on the right, each size 1 or the
    result's), or ``None`` if they do not broadcast."""
    out: list[int] = []
    for shape in shapes:
        if len(shape) > len(out):
            out[:0] = [1] * (len(shape) - len(out))
        offset = len(out) - len(shape)
        for i, size in enumerate(shape):
            have = out[offset + i]
            if have == 1:
                out[offset + i] = size
            elif size not in (1, have):
                return None
    return out


def adaptive_avg_pool2d_value(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``F.adaptive_avg_pool2d(x, output_size)`` for a row-major floating ``x`` of 3 or 4
    dims and an ``output_size`` of positive ints (or ``None``: the input's size): of shape
    ``x.shape[:-2] + output_size``, row-major. (torch computes a 1x1 output as a mean, the
    others with the pooling kernel; both give that.)"""
    if kwargs:
        if set(kwargs) != {"output_size"} or len(args) != 1:
            return None
        args = (args[0], kwargs["output_size"])
    if len(args) != 2:
        return None
    x, size = args
    if not (plain_float(x) and x.dim() in (3, 4) and row_major(x)):
        return None
    if type(size) is int:
        size = (size, size)
    elif type(size) not in (tuple, list, torch.Size) or len(size) != 2:
        return None
    out = []
    for given, own in zip(size, x.shape[-2:]):
        if given is None:
            given = own
        if type(given) is not int or given <= 0:
            return None
        out.append(given)
    return meta_empty((*x.shape[:-2], *out), x.dtype)


def op_value(op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The value of a ``call_function`` or ``call_method`` node computed from its arguments'
    metadata, or ``None`` (run it)."""
    if op == "call_method":
        if target in _POINTWISE_METHODS and not kwargs:
            return pointwise_value(args)
        return None
    try:
        if target in _POINTWISE_FUNCTIONS:
            return None if kwargs else pointwise_value(args)
    except TypeError:  # an unhashable target
        return None
    if target is F.adaptive_avg_pool2d:
        return adaptive_avg_pool2d_value(args, kwargs)
    return None
