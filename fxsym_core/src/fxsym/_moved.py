"""Old import paths of the rooms that moved into :mod:`fxsym.prune`, kept working.

The pruning workflow (importance, planning, search, checkpoint, the CLI, ...) moved from
``fxsym.<room>`` to ``fxsym.prune.<room>``. :class:`MovedFinder`, put first on
:data:`sys.meta_path` when ``fxsym`` is imported, answers for the old names only: importing
``fxsym.checkpoint`` (or a submodule such as ``fxsym.cli.parser``) imports
``fxsym.prune.checkpoint`` and gives *the same module object* under the old name too (one
copy of every class and of every module-level state), with a :class:`DeprecationWarning` naming
the new path. ``python -m fxsym.cli`` still runs the command: the loader hands over the new
module's code. Nothing is left at the old paths on disk.

A moved room read as an attribute of :mod:`fxsym` (``fxsym.persist.read_manifest``, which worked
once anything had imported ``fxsym.persist``) warns the same way (:func:`moved_attribute`). The
facade's names (``fxsym.plan``, ``fxsym.importance``, ``fxsym.prune_checkpoint``, ...) are not
deprecated: they are the public API.

Imports from fxsym: nothing (it names the moved rooms as strings, and imports them on demand).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import CodeType, ModuleType

#: the rooms that moved from ``fxsym.<room>`` to ``fxsym.prune.<room>``
MOVED = ("paths", "options", "request", "console", "phases", "spans", "lockstep",
         "embeddings", "importance", "depth", "planning", "shortlist", "search", "persist",
         "checkpoint", "report_html", "demo", "cli")

_OLD = "fxsym."
_NEW = "fxsym.prune."


def new_name(fullname: str) -> str | None:
    """The module an old import path names now (``fxsym.cli.parser`` ->
    ``fxsym.prune.cli.parser``), ``None`` for a name that did not move."""
    if not fullname.startswith(_OLD):
        return None
    rest = fullname[len(_OLD):]
    if rest.partition(".")[0] not in MOVED:
        return None
    return _NEW + rest


class _MovedLoader(importlib.abc.Loader):
    """Loads an old name as the module at its new path (imported if it is not yet)."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # stacklevel 2: the import statement's frame (importlib's own frames are skipped)
        warnings.warn(f"{spec.name} moved to {self.new}; import it from there "
                      f"({spec.name} will be removed)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module at the new path has run already."""

    def is_package(self, fullname: str) -> bool:
        return hasattr(importlib.import_module(self.new), "__path__")

    def get_code(self, fullname: str) -> CodeType | None:
        """The new module's code, for ``python -m fxsym.cli`` (runpy asks the loader)."""
        spec = importlib.util.find_spec(self.new)
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            return None
        return loader.get_code(self.new)


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old names of moved modules (see the module docstring), nothing else."""

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = new_name(fullname)
        if new is None:
            return None
        found = importlib.util.find_spec(new)
        if found is None:
            return None
        spec = importlib.machinery.ModuleSpec(
            fullname, _MovedLoader(new), origin=found.origin,
            is_package=found.submodule_search_locations is not None)
        if found.submodule_search_locations is not None:
            spec.submodule_search_locations = list(found.submodule_search_locations)
        return spec


def moved_attribute(name: str) -> ModuleType | None:
    """``fxsym.<name>`` read as an attribute (``fxsym.persist.read_manifest``, which worked
    once the old module was imported anywhere): the module at its new path, with the same
    warning, ``None`` if ``name`` is not a moved room."""
    new = new_name(_OLD + name)
    if new is None or "." in name:
        return None
    # stacklevel 3: the line reading the attribute (through fxsym.__getattr__)
    warnings.warn(f"fxsym.{name} moved to {new}; import it from there "
                  f"(fxsym.{name} will be removed)", DeprecationWarning, stacklevel=3)
    return importlib.import_module(new)


def install() -> None:
    """Puts :class:`MovedFinder` first on :data:`sys.meta_path` (once): before the path
    finder, which would load ``fxsym.cli.parser`` from the package's folder a second time."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder())
