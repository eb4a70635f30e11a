"""How fxsym names a class, a callable or a method in messages, listings and lookup keys.

Imports from fxsym: nothing (every room may use it).
"""

from __future__ import annotations

from typing import Any


def qualname(obj: Any, *, module: bool = True) -> str:
    """``module.qualname`` of a class or a callable; a method name (a string) is ``.name()``.

    ``module=False`` leaves the module out, and so does a builtin (``len``, not
    ``builtins.len``). An object with neither ``__qualname__`` nor ``__name__`` is its ``repr``.
    This dotted name is also how a plugin names a class or function of an optional package.
    """
    if isinstance(obj, str):
        return f".{obj}()"
    name = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None) or repr(obj)
    mod = getattr(obj, "__module__", None) if module else None
    return f"{mod}.{name}" if mod and mod != "builtins" else name
