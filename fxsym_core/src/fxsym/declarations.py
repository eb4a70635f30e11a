"""What plugins declare as data, read without importing torch: the analysis options
(:class:`AnalysisOption`, ``fxsym_analysis_options``) and the sizes a request can give by role
(:class:`SizeOption`, ``fxsym_size_options``).

Both hooks answer plain data that a command line turns into flags (``fxsym prune --ffn N``,
``--norm-groups keep``): the flags are the plugins', none is written in fxsym. The command
line must answer ``--help`` and a usage error without importing torch, which loading a plugin
does, so a distribution also names the object implementing those two hooks, importing no
torch, under the entry-point group :data:`GROUP` (the same name as its ``fxsym`` entry point;
the hf plugin's ``fxsym_plugins_hf.declarations``). :func:`declared` reads the declarations of
the plugins in use: where the plugins are loaded in this process (a trace ran, a manager was
selected with :func:`fxsym.plugins.use_plugins`, a plugin was registered in a test), the
hooks of the active manager; else the objects of :data:`GROUP`, with the environment's
``FXSYM_DISABLE_PLUGIN_AUTOLOAD`` and ``FXSYM_PLUGINS`` read as the loader reads them. The
first declaration of a name counts.

Imports from fxsym: errors (the plugins' hooks only inside :func:`declared`).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from .errors import PluginWarning

#: the entry-point group naming each distribution's torch-free declarations
GROUP = "fxsym.declarations"


@dataclass(frozen=True)
class AnalysisOption:
    """An analysis option a plugin declares (``fxsym_analysis_options``): a choice between
    two sound descriptions of what the plugin's rules see, made for one analysis
    (``fxsym.analyze(model, name=value)``, recorded in ``SymMap.analysis_options``).

    ``name`` is the keyword (``--name-with-dashes`` on the command line); ``values`` its values,
    the first the default; ``what`` says what it chooses, for messages; ``help`` the command
    line's help (``what`` if empty). The plugin's rules read the value of the analysis running
    (:func:`fxsym.analysis.options.analysis_option`).

    ``keeps_picked_blocks`` is the value (or ``None``) under which the kernel's rule for a
    group whose entries are picked by value (``topk``, :meth:`OpContext.pick_by_value`) keeps
    the number of blocks a view splits that group into: the unit of the group becomes one
    position of every block, a pick over the blocks' equal copies picks from each, and a view
    that offered a blocks reading (:meth:`OpContext.offer_alternative`) of such a group takes
    it (:func:`fxsym.analysis.options.picked_blocks_kept`).

    ``checkpoint_refusal``, if given, says why a checkpoint directory pruned streamed is
    analyzed with the default value only (another value is refused there, with that reason).
    """

    name: str
    values: tuple[str, ...]
    what: str
    keeps_picked_blocks: str | None = None
    help: str = ""
    checkpoint_refusal: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or len(self.values) < 2 or (
                self.keeps_picked_blocks not in (None, *self.values[1:])):
            raise ValueError(f"analysis option {self.name!r}: a keyword, at least two values "
                             "(the first the default) and keeps_picked_blocks one of the "
                             f"others or None, got values {self.values!r}, "
                             f"keeps_picked_blocks {self.keeps_picked_blocks!r}")

    @property
    def flag(self) -> str:
        """The command line's flag: ``--`` and the name, ``_`` written ``-``."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class SizeOption:
    """A size a request can give by role (``fxsym_size_options``): ``sizes={name: entries}``
    of :func:`fxsym.prune_checkpoint` and :class:`fxsym.PruneRequest`, the command line's
    :attr:`flag` (``--name-with-dashes N``), mapped to groups by the role ``name`` the same
    plugin declares for a model (``fxsym_roles``, :func:`fxsym.prune.search.sizes_for`).
    ``help`` is the flag's help; ``metavar`` its value's name in the usage text."""

    name: str
    help: str
    metavar: str | None = None

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or not self.help:
            raise ValueError(f"size option {self.name!r}: a keyword and a help text")

    @property
    def flag(self) -> str:
        """The command line's flag: ``--`` and the name, ``_`` written ``-``."""
        return "--" + self.name.replace("_", "-")


@dataclass(frozen=True)
class Declarations:
    """The declarations of the plugins in use (:func:`declared`)."""

    analysis: tuple[AnalysisOption, ...] = ()
    sizes: tuple[SizeOption, ...] = ()

    def analysis_option(self, name: str) -> AnalysisOption | None:
        """The analysis option called ``name``, or ``None``."""
        return next((o for o in self.analysis if o.name == name), None)


def declared() -> Declarations:
    """The declarations of the plugins in use (see the module docstring)."""
    if "fxsym.plugins.manager" in sys.modules:
        from .plugins.analysis_options import declared_options, declared_size_options

        return Declarations(tuple(declared_options().values()),
                            tuple(declared_size_options().values()))
    return installed()


def installed() -> Declarations:
    """The declarations of the installed distributions' :data:`GROUP` entry points, as the
    environment selects them (``FXSYM_DISABLE_PLUGIN_AUTOLOAD``, ``FXSYM_PLUGINS``); one
    that fails to load is left out with a :class:`~fxsym.errors.PluginWarning` naming it and
    its distribution (its flags then missing)."""
    if os.environ.get("FXSYM_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() in (
            "1", "true", "yes", "on"):
        return Declarations()
    only = {n.strip() for n in os.environ.get("FXSYM_PLUGINS", "").split(",") if n.strip()}
    analysis: dict[str, AnalysisOption] = {}
    sizes: dict[str, SizeOption] = {}
    for ep in sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name):
        if only and ep.name not in only:
            continue
        try:
            obj = ep.load()
        except Exception as exc:  # a plugin's failure is reported, not raised
            dist = getattr(ep.dist, "name", "an unknown distribution")
            warnings.warn(f"the {GROUP} entry point {ep.name!r} of {dist} ({ep.value}) failed "
                          f"to load, its options are left out: {type(exc).__name__}: {exc}",
                          PluginWarning, stacklevel=2)
            continue
        for option in _answer(obj, "fxsym_analysis_options", AnalysisOption):
            analysis.setdefault(option.name, option)
        for size in _answer(obj, "fxsym_size_options", SizeOption):
            sizes.setdefault(size.name, size)
    return Declarations(tuple(analysis.values()), tuple(sizes.values()))


def _answer(obj: Any, hook: str, kind: type[Any]) -> Sequence[Any]:
    """What ``obj``'s ``hook`` answers, keeping only values of ``kind``."""
    impl: Callable[[], Sequence[Any] | None] | None = getattr(obj, hook, None)
    if impl is None:
        return ()
    return [x for x in impl() or () if isinstance(x, kind)]


__all__ = ["GROUP", "AnalysisOption", "Declarations", "SizeOption", "declared", "installed"]
