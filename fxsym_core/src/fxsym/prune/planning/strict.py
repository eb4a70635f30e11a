"""Strict reading of JSON data from a stranger (a plan file, a manifest).

:func:`strict_loads` is ``json.loads`` refusing what Python's reader accepts but JSON does not
say (``NaN``, numbers out of range, a key repeated) and nesting past :data:`MAX_JSON_DEPTH`;
``_obj``, ``_array``, ``_text``, ``_count`` and ``_key`` read one field of its one JSON type
(an integer is never a float, a string or a bool), raising ``ValueError`` naming the field.
"""

from __future__ import annotations

import json
import math
from typing import Any

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
