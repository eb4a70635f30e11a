"""Submodules by dotted path, each prefix looked up once.

An analysis asks for the module behind every ``call_module`` target and ``get_attr`` owner,
in the traced GraphModule and in the model; paths share long prefixes
(``features.3.block.0.0``, ``features.3.block.0.1``) and neither tree changes while the
analysis runs, so :class:`Submodules` remembers the module at every prefix it resolved.
"""

from __future__ import annotations

from torch import nn

_MISSING = object()


class Submodules:
    """``root.get_submodule(path)``: the same attribute reads, each prefix's result kept."""

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        self._found: dict[str, nn.Module] = {"": root}

    def __call__(self, path: str) -> nn.Module:
        """The module at ``path``; ``AttributeError`` if a step is missing or not a module."""
        found = self._found.get(path)
        if found is not None:
            return found
        parent_path, _, name = path.rpartition(".")
        parent = self(parent_path)
        child = getattr(parent, name, _MISSING)
        if child is _MISSING:
            raise AttributeError(f"{type(parent).__name__} has no attribute `{name}`")
        if not isinstance(child, nn.Module):
            raise AttributeError(f"`{name}` is not an nn.Module")
        self._found[path] = child
        return child


__all__ = ["Submodules"]
