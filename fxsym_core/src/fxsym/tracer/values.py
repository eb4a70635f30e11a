"""Node values computed without running: what a value provably is, from the metadata of what
it is computed from.

Computing each node's value on the ``meta`` device runs torch's meta kernels, many of them in
Python (a convolution is ~0.1 ms of module call, argument checks and shape formula): a large
part of an analysis. The functions here give a value only where its metadata (shape, dtype,
strides, device) is provably what running gives, and ``None`` otherwise: the node is then
run as before, and raises as before when the model is wrong.

* :func:`op_value` is the tracer's own rule for a few common torch ops: pointwise ``add``,
  ``sub``, ``mul`` and true division of floating tensors of one dtype and Python numbers,
  ``F.adaptive_avg_pool2d``, ``torch.cat``, ``F.max_pool2d`` and ``F.avg_pool2d`` (torch's
  meta kernels of the last two are ~0.2 ms of Python shape checks a call) and ``mean`` over
  given dims (~0.5 ms);
* :func:`plain_float`, :func:`row_major`, :func:`nonempty` and :func:`meta_empty` are the
  pieces a family's value rule (``register(..., value=rule)``, see
  ``fxsym_register_sym_infos``) is made of.

What the pointwise rule rests on: on the meta device these ops run torch's Python
references (``torch._refs``), which broadcast the operands and order the output's dims by
their strides (``compute_elementwise_output_logical_to_physical_perm``); when every operand
is row-major (:func:`row_major`: the strides ``torch.empty`` gives its shape, no empty dim)
no dim moves and the output is row-major, and for other layouts of ``float32``/``float64``
:func:`_output_order` asks torch's own function for that ordering. (Half precision is
computed in ``float32``: the references first convert each operand, which lays it out anew;
those are left to running unless row-major.) The tests (``tests/test_value_rules.py``)
compare each rule with running, over many configurations.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F

_torch_output_order: Any
try:  # what torch's meta kernels of pointwise ops order the output's dims by
    from torch._prims_common import (
        compute_elementwise_output_logical_to_physical_perm as _torch_output_order,
    )
except ImportError:  # another torch: those layouts are left to running
    _torch_output_order = None

#: the dtypes the rules accept: a floating tensor meets another of its dtype or a Python
#: number and gives its own dtype back
FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})

_INT64 = (-(2**63), 2**63 - 1)
#: dtypes torch's pointwise meta kernels compute in (no converted copies of the operands)
_OWN_COMPUTE = frozenset({torch.float32, torch.float64})


def plain_float(value: Any) -> bool:
    """``value`` is a plain ``torch.Tensor`` (no subclass) on the meta device, of a floating
    dtype of :data:`FLOATS`, not requiring grad."""
    return (type(value) is torch.Tensor and value.is_meta and value.dtype in FLOATS
            and not value.requires_grad)


def row_major(t: torch.Tensor) -> bool:
    """``t`` has the strides ``torch.empty(t.shape)`` gives (row-major, including the strides
    of dims of size 1) and at least one element."""
    return strides_row_major(t.shape, t.stride())


def strides_row_major(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """:func:`row_major` of a tensor of ``shape`` and ``strides`` (read once by a caller that
    has them)."""
    expected = 1
    for size, stride in zip(reversed(shape), reversed(strides)):
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


def pointwise_value(args: tuple[Any, ...], reciprocal_first: bool = False) -> Any:
    """The value of ``a + b`` (or ``-``, ``*``, ``/``) for ``args == (a, b)``: floating meta
    tensors of one dtype without empty dims (0-d ones too) and Python ints and floats, at
    least one tensor; of the broadcast shape, that dtype, laid out as torch's meta kernel
    lays it out (:func:`_output_order`). ``None`` otherwise (shapes that do not broadcast
    included: running raises). ``reciprocal_first``: ``number / tensor``, which torch
    computes as ``tensor.reciprocal() * number`` (two ops, each laying out its output)."""
    if len(args) != 2:
        return None
    dtype = None
    tensors = []
    plain = True
    for a in args:
        if type(a) is torch.Tensor:
            if not plain_float(a) or (dtype is not None and a.dtype != dtype):
                return None
            dtype = a.dtype
            tensors.append(a)
            plain = plain and row_major(a)
        elif not _number(a):
            return None
    if dtype is None:
        return None
    shape = _broadcast([t.shape for t in tensors])
    if shape is None:
        return None
    if plain:  # every operand row-major: no dimension is ever reordered
        return meta_empty(shape, dtype)
    if dtype not in _OWN_COMPUTE or not all(nonempty(t) for t in tensors):
        return None  # half precision is computed in float32: converted copies come first
    if reciprocal_first:
        order = _output_order(tensors, shape)
        if order is None:
            return None
        tensors = [_permuted(shape, order, dtype)]
    order = _output_order(tensors, shape)
    return None if order is None else _permuted(shape, order, dtype)


def _permuted(shape: list[int], order: list[int], dtype: torch.dtype) -> torch.Tensor:
    return torch.empty_permuted(shape, order, dtype=dtype, device="meta")


def _output_order(tensors: list[torch.Tensor], shape: list[int]) -> list[int] | None:
    """The order of dims, outermost first, of the output of a pointwise op on ``tensors``
    of broadcast ``shape`` (all sizes positive), as torch's meta kernel of these ops computes
    it: the function of torch's it calls, on the operands broadcast to ``shape``. ``None``
    where this torch has no such function or it answers in another form."""
    if _torch_output_order is None:
        return None
    target = tuple(shape)
    found: Any = _torch_output_order(*(t if t.shape == target else t.expand(target)
                                       for t in tensors))
    if isinstance(found, tuple):  # (order, whether the layout is ambiguous) in newer torch
        found = found[0]
    return list(found) if isinstance(found, list) else None


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


def cat_value(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``torch.cat(tensors, dim)`` of row-major floating meta tensors of one dtype and one
    number of dims (at least 1), sizes equal but along ``dim``: row-major, sizes summed
    along ``dim``. (torch's meta kernel concatenates into a row-major tensor, then copies it
    to the memory format its inputs suggest, which a row-major input makes row-major.)"""
    if len(args) == 2 and not kwargs:
        tensors, dim = args
    elif len(args) == 1 and set(kwargs) <= {"dim"}:
        tensors, dim = args[0], kwargs.get("dim", 0)
    else:
        return None
    if type(tensors) not in _SEQUENCES or not tensors or type(dim) is not int:
        return None
    first = tensors[0]
    if type(first) is not torch.Tensor:
        return None
    ndim, dtype = first.dim(), first.dtype
    if not -ndim <= dim < ndim:
        return None
    dim %= ndim
    shape = list(first.shape)
    total = 0
    for t in tensors:
        if not (plain_float(t) and t.dtype == dtype and t.dim() == ndim and row_major(t)):
            return None
        for i, (size, want) in enumerate(zip(t.shape, shape)):
            if i != dim and size != want:
                return None
        total += t.shape[dim]
    shape[dim] = total
    return meta_empty(shape, dtype)


_SEQUENCES = (list, tuple, torch.fx.immutable_collections.immutable_list)

#: the parameters of ``F.max_pool2d`` and of ``F.avg_pool2d`` (``torch._C._nn.avg_pool2d``)
#: after the input, with their defaults
_MAX_POOL = (("kernel_size", None), ("stride", None), ("padding", 0), ("dilation", 1),
             ("ceil_mode", False), ("return_indices", False))
_AVG_POOL = (("kernel_size", None), ("stride", None), ("padding", 0), ("ceil_mode", False),
             ("count_include_pad", True), ("divisor_override", None))


#: the parameters of ``x.mean``/``torch.mean`` after the input
_MEAN = (("dim", None), ("keepdim", False))


def _bound(args: tuple[Any, ...], kwargs: dict[str, Any],
           params: tuple[tuple[str, Any], ...]) -> dict[str, Any] | None:
    """``args[1:]`` and ``kwargs`` bound to ``params`` (names and defaults), or ``None`` if
    they do not bind (too many, unknown or repeated names)."""
    if len(args) - 1 > len(params) or not set(kwargs) <= {n for n, _ in params}:
        return None
    bound = dict(params)
    for (name, _), value in zip(params, args[1:]):
        if name in kwargs:
            return None
        bound[name] = value
    bound.update(kwargs)
    return bound


def _pair(value: Any) -> tuple[int, int] | None:
    """An int, or a sequence of one or two ints, as two ints (``None``: anything else)."""
    if type(value) is int:
        return value, value
    if type(value) in _SEQUENCES and len(value) in (1, 2) and all(
            type(v) is int for v in value):
        return (value[0], value[-1])
    return None


def _pooled(size: int, kernel: int, stride: int, pad: int, dilation: int,
            ceil: bool) -> int | None:
    """The output size of a pooling along one dim, by torch's formula, or ``None`` where torch
    refuses the arguments (a non-positive kernel, stride or dilation, padding beyond half the
    kernel, no output)."""
    if kernel < 1 or stride < 1 or dilation < 1 or not 0 <= pad <= kernel // 2:
        return None
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil else 0)) // stride + 1
    if ceil and (out - 1) * stride >= size + pad:  # the last window starts in the padding
        out -= 1
    return out if out >= 1 else None


def pool2d_value(args: tuple[Any, ...], kwargs: dict[str, Any], *, dilated: bool) -> Any:
    """``F.max_pool2d`` (``dilated``) or ``F.avg_pool2d`` of a row-major floating 4-d ``x``,
    without indices: of torch's pooled sizes, row-major."""
    bound = _bound(args, kwargs, _MAX_POOL if dilated else _AVG_POOL)
    if not args or bound is None:
        return None
    x = args[0]
    if not (plain_float(x) and x.dim() == 4 and row_major(x)):
        return None
    kernel = _pair(bound["kernel_size"])
    given = bound["stride"]
    stride = kernel if given is None or (type(given) in _SEQUENCES and not given) else (
        _pair(given))
    padding = _pair(bound["padding"])
    dilation = _pair(bound["dilation"]) if dilated else (1, 1)
    ceil = bound["ceil_mode"]
    if (kernel is None or stride is None or padding is None or dilation is None
            or type(ceil) is not bool):
        return None
    if dilated and bound["return_indices"] is not False:
        return None
    if not dilated and (type(bound["count_include_pad"]) is not bool or bound[
            "divisor_override"] is not None):
        return None
    out: list[int] = []
    for size, params in zip(x.shape[2:], zip(kernel, stride, padding, dilation)):
        pooled = _pooled(size, *params, ceil)
        if pooled is None:
            return None
        out.append(pooled)
    return meta_empty((*x.shape[:2], *out), x.dtype)


def mean_value(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``x.mean(dims)`` (``keepdim`` given or not) of a row-major floating ``x`` over dims
    given as an int or a sequence of distinct ints: of ``x``'s shape without those dims (of
    size 1 with ``keepdim``), row-major."""
    bound = _bound(args, kwargs, _MEAN)
    if not args or bound is None:
        return None
    x, dims, keep = args[0], bound["dim"], bound["keepdim"]
    if not (plain_float(x) and row_major(x) and type(keep) is bool and x.dim() > 0):
        return None
    if type(dims) is int:
        dims = (dims,)
    if type(dims) not in _SEQUENCES or not dims or any(type(d) is not int for d in dims):
        return None
    ndim = x.dim()
    if any(not -ndim <= d < ndim for d in dims):
        return None
    reduced = {d % ndim for d in dims}
    if len(reduced) != len(dims):
        return None
    shape = [1 if i in reduced else n for i, n in enumerate(x.shape) if keep or i not in reduced]
    return meta_empty(shape, x.dtype)


def op_value(op: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The value of a ``call_function`` or ``call_method`` node computed from its arguments'
    metadata, or ``None`` (run it)."""
    if op == "call_method":
        if target in _POINTWISE_METHODS and not kwargs:
            return pointwise_value(args)
        if target == "mean":
            return mean_value(args, kwargs)
        return None
    try:
        if target in _POINTWISE_FUNCTIONS:
            if kwargs:
                return None
            return pointwise_value(args, reciprocal_first=target is operator.truediv
                                   and type(args[0]) is not torch.Tensor)
    except TypeError:  # an unhashable target
        return None
    if target is F.adaptive_avg_pool2d:
        return adaptive_avg_pool2d_value(args, kwargs)
    if target is torch.cat:
        return cat_value(args, kwargs)
    if target is F.max_pool2d or target is F.avg_pool2d:
        return pool2d_value(args, kwargs, dilated=target is F.max_pool2d)
    if target is torch.mean:
        return mean_value(args, kwargs)
    return None
