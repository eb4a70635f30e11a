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

One rule, :func:`first_of_each`, gathers the answers on both paths: an answer that is not of
the hook's type is refused (:class:`~fxsym.errors.AnalysisError` naming the plugin), the same
message whichever path read it. The entry points are scanned and loaded once per process, as
the plugin loader scans its own group once: :func:`rescan` (which
``fxsym.load_plugins(rescan=True)`` calls) reads them again, e.g. after a ``pip install`` in
the same process; the environment is read at every call.

Imports from fxsym: errors (the plugins' hooks only inside :func:`declared`).
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import TypeVar

from .errors import AnalysisError, PluginWarning

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
    environment selects them (``FXSYM_DISABLE_PLUGIN_AUTOLOAD``, ``FXSYM_PLUGINS``); the first
    declaration of a name counts (:func:`installed_by_plugin`)."""
    analysis: dict[str, AnalysisOption] = {}
    sizes: dict[str, SizeOption] = {}
    for each in installed_by_plugin().values():
        for option in each.analysis:
            analysis.setdefault(option.name, option)
        for size in each.sizes:
            sizes.setdefault(size.name, size)
    return Declarations(tuple(analysis.values()), tuple(sizes.values()))


def installed_by_plugin() -> dict[str, Declarations]:
    """``{entry point name: its declarations}`` of the :data:`GROUP` entry points the
    environment selects, by name (the first entry point of a name counts, as the plugin loader
    takes it); one that fails to load is left out with a :class:`~fxsym.errors.PluginWarning`
    naming it and its distribution (its flags then missing), said once per process. An answer
    of another type is refused by :func:`first_of_each`."""
    if os.environ.get("FXSYM_DISABLE_PLUGIN_AUTOLOAD", "").strip().lower() in (
            "1", "true", "yes", "on"):
        return {}
    only = {n.strip() for n in os.environ.get("FXSYM_PLUGINS", "").split(",") if n.strip()}
    out: dict[str, Declarations] = {}
    for ep in _entry_points():
        if ep.name in out or (only and ep.name not in only) or (obj := _loaded(ep)) is None:
            continue
        source = (ep.name, _distribution(ep))
        out[ep.name] = Declarations(
            tuple(first_of_each([(*source, _answer(obj, "fxsym_analysis_options"))],
                                "fxsym_analysis_options", AnalysisOption).values()),
            tuple(first_of_each([(*source, _answer(obj, "fxsym_size_options"))],
                                "fxsym_size_options", SizeOption).values()))
    return out


#: a declaration's type
D = TypeVar("D", AnalysisOption, SizeOption)


def first_of_each(answers: Iterable[tuple[str, str, object]], hook: str,
                  kind: type[D]) -> dict[str, D]:
    """``{name: declaration}`` of ``answers`` (each plugin's name, its distribution and what
    its ``hook`` answered, in the plugins' order), the first declaration of a name counting.
    An answer that is not a sequence of ``kind`` (``None`` is none) breaks the hook's
    contract: an :class:`~fxsym.errors.AnalysisError` naming the plugin, its distribution
    and the value."""
    out: dict[str, D] = {}
    for plugin, distribution, answer in answers:
        if answer is None:
            continue
        if not isinstance(answer, Sequence) or isinstance(answer, str):
            raise _broken(plugin, distribution, hook, kind, answer, "")
        kept = [x for x in answer if isinstance(x, kind)]
        if len(kept) < len(answer):
            wrong = next(x for x in answer if not isinstance(x, kind))
            raise _broken(plugin, distribution, hook, kind, wrong, "a sequence holding ")
        for option in kept:
            out.setdefault(option.name, option)
    return out


def _broken(plugin: str, distribution: str, hook: str, kind: type[D], value: object,
            holding: str) -> AnalysisError:
    """The refusal of ``plugin``'s ``hook`` answering ``value`` (or a sequence holding it)."""
    return AnalysisError(
        f"fxsym plugin {plugin!r} (distribution {distribution!r}) answers {hook} with "
        f"{holding}a {type(value).__name__} ({value!r}), not a sequence of {kind.__name__}: "
        f"make it answer fxsym.declarations.{kind.__name__} values, or leave the plugin out "
        "(FXSYM_PLUGINS)")


def rescan() -> None:
    """Scan and load the :data:`GROUP` entry points again at the next :func:`installed` (the
    scan and the loaded objects are kept for the process)."""
    _entry_points.cache_clear()
    _loaded.cache_clear()
    _distribution.cache_clear()


@functools.cache
def _entry_points() -> tuple[metadata.EntryPoint, ...]:
    return tuple(sorted(metadata.entry_points(group=GROUP), key=lambda e: e.name))


@functools.cache
def _loaded(ep: metadata.EntryPoint) -> object | None:
    """The object ``ep`` names, or ``None`` (with a warning) if it fails to load."""
    try:
        obj: object = ep.load()
    except Exception as exc:  # a plugin's failure is reported, not raised
        warnings.warn(f"the {GROUP} entry point {ep.name!r} of {_distribution(ep)} "
                      f"({ep.value}) failed to load, its options are left out: "
                      f"{type(exc).__name__}: {exc}", PluginWarning, stacklevel=4)
        return None
    return obj


@functools.cache
def _distribution(ep: metadata.EntryPoint) -> str:
    """The name of ``ep``'s distribution (read from its metadata: kept, as the scan is)."""
    return getattr(ep.dist, "name", None) or "<unknown>"


def _answer(obj: object, hook: str) -> object:
    """What ``obj``'s ``hook`` answers (``None`` where it has no such function)."""
    impl = getattr(obj, hook, None)
    return None if impl is None else impl()


__all__ = ["GROUP", "AnalysisOption", "Declarations", "SizeOption", "declared", "first_of_each",
           "installed", "installed_by_plugin", "rescan"]
