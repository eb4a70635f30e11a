"""An unknown value or a model that raised: how a failed node value is read.

When computing a node's value on the meta device fails (:mod:`.nodevalues`), it either means
the value cannot be known without data (no meta kernel, ``.item()``, ``nonzero``: the node
keeps no value, :data:`_FAILED`, and the report says so), or that the model raised on the
example inputs (a :class:`~fxsym.errors.ModelError`). Torch reports several of the first
kind with a plain ``RuntimeError``, as it does a shape mismatch, so the type alone does not
tell: :class:`_DataDependence` runs the op once more and raises :class:`_NeedsData` at the
first op whose output depends on a meta tensor's data. :data:`_MODEL_RAISED` are the errors a
model raises to reject its inputs.

Imports from fxsym: nothing.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

_FAILED = object()


class _UnknownValue(Exception):
    pass


class _NeedsData(Exception):
    """An op asked for the data of a meta tensor."""


# torch leaves TorchDispatchMode.__init_subclass__ and __init__ untyped
class _DataDependence(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Raise :class:`_NeedsData` at an op whose output depends on a meta tensor's data."""

    _TAGS = (torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if any(tag in func.tags for tag in self._TAGS) and any(
            isinstance(a, torch.Tensor) and a.is_meta for a in pytree.tree_leaves((args, kwargs))
        ):
            raise _NeedsData(str(func))
        return func(*args, **kwargs)


#: errors a model raises to reject its inputs: with example inputs given, the model raised
_MODEL_RAISED = (ValueError, AssertionError)

#: errors that mean "the value is unknown" (not "the model raised"): no meta kernel, no data
#: to copy out of a meta tensor, torch's data-dependent errors
_VALUE_UNKNOWN: tuple[type[Exception], ...] = (
    NotImplementedError,
    DataDependentOutputException,
    DynamicOutputShapeException,
    _NeedsData,
)


def _value_unknown_type(exc: Exception) -> bool:
    """``exc`` is one of :data:`_VALUE_UNKNOWN`, or torch's ``GuardOnDataDependentSymNode``
    (looked up only if its module is loaded: importing it costs most of a second)."""
    if isinstance(exc, _VALUE_UNKNOWN):
        return True
    shapes = sys.modules.get("torch.fx.experimental.symbolic_shapes")
    guard = getattr(shapes, "GuardOnDataDependentSymNode", None)
    return guard is not None and isinstance(exc, guard)
