"""What a resize rule of a module can read, as a key: its *signature* (per submodule its class,
plain attributes and tensor shapes: modules with the same signature get the same layout, so
a transformer's layers run once) and its *kind* (the same with sizes left out: the convs of a
CNN need one trial each once one of them has shown how its rule keeps entries).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

#: one parameter a module holds: (submodule path, attribute, the model's name for it)
_Slot = tuple[str, str, str]


_PLAIN = (int, float, str, bool, type(None))


def _signature(mod: nn.Module, slots: Sequence[_Slot]) -> tuple[Any, Any]:
    """What a resize rule of ``mod`` can read: per submodule its class and plain attributes
    (objects held, such as a config, by identity), the shapes of its tensors; and the
    module's *kind*: the same with sizes left out (numbers by their type, tensors by their
    number of dims). ``(None, None)`` when a value cannot be keyed (nothing is reused then)."""
    parts: list[Any] = []
    kinds: list[Any] = []
    try:
        for sub, m in mod.named_modules(remove_duplicate=False):
            state: list[tuple[Any, ...]] = []
            kind: list[tuple[Any, ...]] = []
            for k, v in vars(m).items():
                if k in ("_parameters", "_buffers", "_modules"):
                    continue
                if isinstance(v, _PLAIN) or (isinstance(v, tuple) and all(
                        isinstance(x, _PLAIN) for x in v)):
                    state.append((k, v))
                    kind.append((k, _sizes_left_out(v)))
                elif isinstance(v, (dict, list, set)):
                    if v:
                        return None, None
                else:
                    state.append((k, type(v), id(v)))
                    kind.append(state[-1])
            tensors = [(n, t.shape, t.dtype) for n, t in (
                *m.named_parameters(recurse=False, remove_duplicate=False),
                *m.named_buffers(recurse=False, remove_duplicate=False))]
            parts.append((sub, type(m), tuple(state),
                          tuple((n, tuple(shape), dtype) for n, shape, dtype in tensors)))
            kinds.append((sub, type(m), tuple(kind),
                          tuple((n, len(shape), dtype) for n, shape, dtype in tensors)))
        tied = tuple(name for _, _, name in slots)  # which places share a parameter
        shared = tuple(tied.index(n) for n in tied)
        key = (tuple(parts), shared)
        alike = (tuple(kinds), shared)
        hash(key)
        hash(alike)
    except TypeError:
        return None, None
    return key, alike


def _sizes_left_out(v: Any) -> Any:
    if type(v) in (int, float):
        return type(v)
    return tuple(map(_sizes_left_out, v)) if isinstance(v, tuple) else v
