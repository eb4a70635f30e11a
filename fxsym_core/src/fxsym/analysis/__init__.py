"""The symbol analyzer: layouts, groups, op-rule context and ``analyze``.

The analysis options are the plugins' (:mod:`.options`); the readers this package once gave
by an option's name (``fxsym.analysis.norm_groups()``) still answer, deprecated: a plugin's
rules read :func:`~fxsym.analysis.options.analysis_option`.

Imports from fxsym: errors, modstate, naming, plugins, registry, symbols, tracer (room order:
``tests/test_layering.py``).
"""

import importlib.util
import warnings
from collections.abc import Callable

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
from .options import analysis_option, declared_options

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
    "analysis_option",
    "analyze",
    "concat_dims",
    "dim_size",
    "fixed_dim",
    "fixed_layout",
    "group_dim",
    "is_fixed",
    "iter_dims",
    "resolve_dim",
    "scale_block",
    "size_checked",
    "tie_size",
]


def __getattr__(name: str) -> Callable[[], str]:
    """``fxsym.analysis.<option>``: a reader of a declared analysis option's value (its
    default outside an analysis giving it), deprecated."""
    submodule = name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}")
    option = None if submodule else declared_options().get(name)
    if option is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"fxsym.analysis.{name}() is deprecated: read the analysis option with "
                  f"fxsym.analysis.options.analysis_option({name!r}) (None: the default "
                  f"{option.values[0]!r})", DeprecationWarning, stacklevel=2)
    default = option.values[0]

    def read() -> str:
        return analysis_option(name) or default

    read.__name__ = name
    return read
