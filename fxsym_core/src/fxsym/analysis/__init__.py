"""The symbol analyzer: layouts, groups, op-rule context and ``analyze``.

Imports from fxsym: errors, modstate, naming, plugins, registry, symbols, tracer (room order:
``tests/test_layering.py``).
"""

from .analyzer import Analyzer, resolve_dim
from .api import analyze
from .attributes import size_checked, tie_size
from .context import OpContext, Unsupported
from .groups import GroupTable
from .layout import (
    AttributeSize,
    Dim,
    Layout,
    Seg,
    SizeLayout,
    TensorLayout,
    concat_dims,
    dim_size,
    fixed_dim,
    fixed_layout,
    group_dim,
    is_fixed,
    iter_dims,
    scale_block,
)
from .options import norm_groups, routing_groups

__all__ = [
    "Analyzer",
    "AttributeSize",
    "Dim",
    "GroupTable",
    "Layout",
    "OpContext",
    "Seg",
    "SizeLayout",
    "TensorLayout",
    "Unsupported",
    "analyze",
    "concat_dims",
    "dim_size",
    "fixed_dim",
    "fixed_layout",
    "group_dim",
    "is_fixed",
    "iter_dims",
    "norm_groups",
    "resolve_dim",
    "routing_groups",
    "scale_block",
    "size_checked",
    "tie_size",
]
