"""Attribute members: an int attribute of a module read as a size.

Such an attribute joins the groups it sizes as a member ``(owner, "attr:name")``
(:data:`ATTRIBUTE_PREFIX`); element ``i`` of a tuple of ints is ``(owner, "attr:name[i]")``,
and ``name`` may be dotted (``"config.hidden"``: a field of an object the module holds).
:func:`attribute_value` and :func:`set_attribute` read and write the attribute by that name.
"""

from __future__ import annotations

from typing import Any

#: the prefix of an attribute member's symbol name: ``(owner, "attr:num_heads")``
ATTRIBUTE_PREFIX = "attr:"


# an int attribute read as a size is a member ``(owner, "attr:name")``, element ``i`` of a
# tuple of ints ``(owner, "attr:name[i]")``; these read and write the attribute by that name
def attribute_value(mod: Any, name: str) -> Any:
    """The value of attribute member ``name`` of ``mod``: ``"hidden"``, ``"config.hidden"``
    (a field of an object it holds) or ``"shape[i]"`` (element ``i`` of a tuple); ``None`` if
    there is none."""
    base, index = _element(name)
    value = mod
    for part in base.split("."):
        value = getattr(value, part, None)
    if index is None:
        return value
    return value[index] if isinstance(value, tuple) and index < len(value) else None


def set_attribute(mod: Any, name: str, n: int) -> None:
    """Set attribute member ``name`` of ``mod`` to ``n`` (for ``"shape[i]"``: a new tuple with
    element ``i`` replaced)."""
    base, index = _element(name)
    if index is None:
        setattr(mod, base, n)
        return
    value = tuple(getattr(mod, base))
    setattr(mod, base, (*value[:index], n, *value[index + 1:]))


def _element(name: str) -> tuple[str, int | None]:
    if name.endswith("]") and "[" in name:
        base, _, index = name[:-1].rpartition("[")
        if index.isdigit():
            return base, int(index)
    return name, None
