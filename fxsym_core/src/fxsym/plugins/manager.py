"""Loading plugins from the ``fxsym`` entry-point group, and disabling the ones that fail.

The entry-point scan runs once per process (``rescan=True`` repeats it, and that of the
:mod:`fxsym.declarations` entry points); loading is idempotent. An entry point names a module
or an object whose hook implementations are registered as they are, or a class: each manager
then registers an instance of its own, which is where a plugin keeps per-manager state
(caches, what it discovered in models).

Several managers may live in one process (:func:`use_plugins` selects one for a block of
code); the *default* manager is the one the entry points are loaded into by
:func:`load_plugins` and by every trace made outside :func:`use_plugins`.

Each entry point is loaded on its own: one that fails is recorded in
:attr:`PluginManager.failed`, reported with a :class:`~fxsym.errors.PluginWarning` naming the
entry point and its distribution, and skipped. ``FXSYM_STRICT_PLUGINS=1`` raises instead.

Importing a plugin runs arbitrary code: anything it raises is caught, ``SystemExit`` included
(a plugin calling ``sys.exit()`` at import must not end the host). Only ``KeyboardInterrupt``
and ``GeneratorExit`` keep their meaning (:data:`PLUGIN_ERRORS`).

A plugin that fails later, in any hook (see :mod:`fxsym.plugins.calls`; a typed
:class:`~fxsym.errors.FxsymError` it raises is a refusal, not a failure), is *disabled*
(:meth:`PluginManager.disable`): blocked with pluggy's ``set_blocked`` (which unregisters it
and bumps :attr:`PluginManager.generation`, so the registry collects the contributions again
without it), recorded in ``failed`` and reported once. A plugin that fails at import is
blocked too, so ``pm.is_blocked(name)`` answers for every inactive plugin. It stays off for
the rest of the process; ``load_plugins(rescan=True)`` clears the failures, unblocks their
names and tries every entry point again (e.g. after installing a fixed version). A name stays
blocked exactly as long as its failure is recorded: dropping it from ``failed`` unblocks it.

``load_plugins(block=[...])`` blocks the named plugins the same way (``set_blocked``). The
block holds for the later ``load_plugins()`` calls (every trace makes one) until a call passes
``allow`` or ``block`` again (which replace the previous choice) or ``rescan=True`` (which
clears it): then the names no longer blocked are unblocked and their entry points loaded.

Environment:

* ``FXSYM_DISABLE_PLUGIN_AUTOLOAD=1``: load no entry point;
* ``FXSYM_PLUGINS=a,b``: load only the entry points named ``a`` and ``b`` (a name that matches
  no installed entry point warns, listing the known ones);
* ``FXSYM_STRICT_PLUGINS=1``: a failing plugin raises :class:`~fxsym.errors.PluginError`
  (after being disabled and recorded, like in the lenient mode);
* ``FXSYM_DEBUG=1``: every hook call is written to stderr through pluggy's tracer
  (:meth:`PluginManager.trace_hooks`): the hook, the plugin(s) called, the arguments' types
  and the result's type (or the exception), plus the names blocked and unblocked.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from importlib import metadata
from types import CodeType, FrameType
from typing import Any, Literal

import pluggy

from ..declarations import rescan as rescan_declarations
from ..errors import PluginError, PluginWarning
from . import hookspecs

GROUP = "fxsym"

#: hooks that were replaced, and by what (named when a plugin still implements them)
RENAMED = {"fxsym_register_leaf_policies": "fxsym_leaf_module, a firstresult hook"}

#: what a plugin may raise and be isolated from; ``KeyboardInterrupt`` and ``GeneratorExit``
#: are not a plugin's failure and propagate
PLUGIN_ERRORS: tuple[type[BaseException], ...] = (Exception, SystemExit)


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded (``during="import"``) or whose hook raised
    (``during`` names the hook); it is not registered."""

    name: str
    distribution: str
    error: str
    during: str = "import"


@dataclass(frozen=True)
class PluginSource:
    """Where a registered plugin came from."""

    name: str
    distribution: str
    version: str


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def strict() -> bool:
    return _env_flag("FXSYM_STRICT_PLUGINS")


@functools.cache
def _entry_points() -> tuple[metadata.EntryPoint, ...]:
    return tuple(metadata.entry_points(group=GROUP))


def _type_names(result: object) -> str:
    """``tuple``, or ``[SymInfo, NoneType]`` for the list a non-firstresult hook returns."""
    if isinstance(result, list):
        return f"[{', '.join(type(r).__name__ for r in result)}]"
    return type(result).__name__


def _code(impl: pluggy.HookImpl) -> CodeType | None:
    code = getattr(inspect.unwrap(impl.function), "__code__", None)
    return code if isinstance(code, CodeType) else None


def blame(exc: BaseException, impls: list[pluggy.HookImpl]) -> pluggy.HookImpl | None:
    """The implementation among ``impls`` whose frame is deepest in ``exc``'s traceback (the
    one that raised, or that its callee's error passed through last), or ``None``."""
    by_code: dict[CodeType, list[pluggy.HookImpl]] = {}
    for impl in impls:
        code = _code(impl)
        if code is not None:
            by_code.setdefault(code, []).append(impl)
    found: pluggy.HookImpl | None = None
    tb = exc.__traceback__
    while tb is not None:
        candidates = by_code.get(tb.tb_frame.f_code)
        if candidates:
            owner = tb.tb_frame.f_locals.get("self")  # one class registered twice
            found = next((i for i in candidates
                          if getattr(i.function, "__self__", owner) is owner), candidates[0])
        tb = tb.tb_next
    return found


_ProfileEvent = Literal["call", "return", "c_call", "c_return", "c_exception"]


class _Answers:
    """What each plain implementation of one ``firstresult`` hook call returned, seen by a
    profile function set from construction until :meth:`stop` (and chained to the one that
    was set before)."""

    def __init__(self, impls: Sequence[pluggy.HookImpl]) -> None:
        self._codes: dict[CodeType, str] = {}
        for impl in impls:
            code = getattr(impl.function, "__code__", None)
            if isinstance(code, CodeType) and not (impl.wrapper or impl.hookwrapper):
                self._codes[code] = impl.plugin_name
        self._seen: list[tuple[str, object]] = []
        self._previous = sys.getprofile()
        sys.setprofile(self._profile)

    def _profile(self, frame: FrameType, event: _ProfileEvent, arg: object) -> None:
        if event == "return" and frame.f_code in self._codes:
            self._seen.append((self._codes[frame.f_code], arg))
        if self._previous is not None:
            self._previous(frame, event, arg)

    def stop(self) -> tuple[str, tuple[str, ...]]:
        """Restore the previous profile function; return the answering plugin's name and
        ``("(name --> type, ...)",)`` for the plugins asked (empty if none returned)."""
        sys.setprofile(self._previous)
        answering = next((name for name, value in self._seen if value is not None), "none")
        asked = ", ".join(f"{name} --> {type(value).__name__}" for name, value in self._seen)
        return answering, (f"({asked})",) if asked else ()


def _dist_of(ep: metadata.EntryPoint) -> tuple[str, str]:
    dist = getattr(ep, "dist", None)
    if dist is None:
        return "<unknown>", ""
    return dist.metadata["Name"] or "<unknown>", dist.version or ""


class PluginManager(pluggy.PluginManager):
    """pluggy's manager plus where each plugin came from and which failed."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        for spec in hookspecs.HOOKS:
            self.add_hookspecs(spec)
        self._failed: list[PluginFailure] = []
        self.sources: dict[str, PluginSource] = {}
        self.generation = 0
        self._from_entry_points: set[str] = set()
        self._blocked_on_request: set[str] = set()  # by ``load_plugins(block=...)``
        self._unknown_warned: tuple[list[str], list[str]] | None = None
        self._debug_undo: Callable[[], None] | None = None  # FXSYM_DEBUG's tracing
        self._trace_writers: list[Callable[[str], object]] = []
        self._undo_monitoring: Callable[[], None] = lambda: None

    @property
    def failed(self) -> list[PluginFailure]:
        """The plugins that failed, at import or in a hook; their names are blocked."""
        return self._failed

    @failed.setter
    def failed(self, failures: list[PluginFailure]) -> None:
        kept = {f.name for f in failures}
        for name in {f.name for f in self._failed} - kept - self._blocked_on_request:
            self.unblock(name)
        for name in kept:
            self.set_blocked(name)
        self._failed = list(failures)

    def register(self, plugin: Any, name: str | None = None) -> str | None:
        """pluggy's ``register``, refusing (``pluggy.PluginValidationError``) a plugin that
        implements a hook fxsym does not specify: a misspelt or removed hook would otherwise
        be ignored without a word."""
        result = super().register(plugin, name)
        if result is None:  # the name is blocked, nothing was registered
            return None
        unknown = sorted({caller.name for caller in self.get_hookcallers(plugin) or []
                          if caller.spec is None and any(
                              i.plugin is plugin and not i.optionalhook
                              for i in caller.get_hookimpls())})
        if unknown:
            super().unregister(plugin)
            hints = [f"{n} (now {RENAMED[n]})" if n in RENAMED else n for n in unknown]
            raise pluggy.PluginValidationError(
                plugin, f"plugin {result!r} implements hooks fxsym does not know: "
                        f"{', '.join(hints)}")
        self.generation += 1
        return result

    def unregister(self, plugin: Any = None, name: str | None = None) -> Any:
        result = super().unregister(plugin, name)
        if result is not None:
            self.generation += 1
        return result

    def contributions_changed(self) -> None:
        """Tell fxsym that a plugin's registrations changed (say, it discovered new classes
        in a model): they are collected again before the next lookup."""
        self.generation += 1

    def set_blocked(self, name: str) -> None:
        """Block ``name`` (pluggy's ``set_blocked``: unregistered if registered, and later
        registrations under that name are ignored)."""
        if not self.is_blocked(name):
            super().set_blocked(name)
            self.trace("blocked", name)

    def unblock(self, name: str) -> bool:
        unblocked = super().unblock(name)
        if unblocked:
            self.trace("unblocked", name)
        return unblocked

    def plugin_names(self) -> list[str]:
        """The names of the registered plugins (blocked names left out)."""
        return [name for name, plugin in self.list_name_plugin() if plugin is not None]

    def trace_hooks(self, write: Callable[[str], object]) -> Callable[[], None]:
        """Write every hook call to ``write`` through pluggy's tracer (``pm.trace``, tag
        ``hook``) and hook-call monitoring; returns the function undoing it.

        Each call gives two lines (each ending in a newline), nested calls indented::

            fxsym_example_inputs -> hf, nn [hook]
                model: DemoNet
            finish fxsym_example_inputs <- nn --> tuple (hf --> NoneType, nn --> tuple) [hook]

        After ``->``: the plugins the call may ask, in pluggy's order (wrappers included).
        After ``<-``: for a ``firstresult`` hook the plugin whose answer was taken (``none``
        if none answered; a wrapper may still have replaced it), then each plugin asked and
        the type of its answer; for a collecting hook the plugin(s) called (fxsym calls
        each plugin on its own, :mod:`fxsym.plugins.calls`). A raising call gives ``raised``
        and the exception instead of ``-->``. Only types are shown, never values. Several
        writers (``FXSYM_DEBUG`` and ``fxsym plugins --trace``) each get every line once.

        Which plugin answered a ``firstresult`` hook is seen with a ``sys.setprofile``
        function active during that call only (pluggy reports the hook's result, not its
        source); it is chained to any profiler already set, and tracing is off by default.
        """
        hooktrace = self.trace.root.get("hook")
        answers: list[_Answers] = []

        def names(impls: Sequence[pluggy.HookImpl]) -> str:
            return ", ".join(i.plugin_name for i in reversed(impls)) or "no plugin"

        def firstresult(hook_name: str) -> bool:
            spec = getattr(self.hook, hook_name).spec
            return spec is not None and bool(spec.opts.get("firstresult"))

        def before(hook_name: str, impls: Sequence[pluggy.HookImpl],
                   kwargs: Mapping[str, object]) -> None:
            hooktrace.root.indent += 1
            hooktrace(hook_name, "->", names(impls),
                      {k: type(v).__name__ for k, v in kwargs.items()})
            if firstresult(hook_name):
                answers.append(_Answers(impls))

        def after(outcome: pluggy.Result[object], hook_name: str,
                  impls: Sequence[pluggy.HookImpl], kwargs: Mapping[str, object]) -> None:
            asked: tuple[str, ...] = ()
            who = names(impls)
            if firstresult(hook_name) and answers:
                who, asked = answers.pop().stop()
            exc = outcome.exception
            if exc is None:
                hooktrace("finish", hook_name, "<-", who, "-->",
                          _type_names(outcome.get_result()), *asked)
            else:
                culprit = blame(exc, list(impls))
                hooktrace("finish", hook_name, "<-", culprit.plugin_name if culprit else who,
                          "raised", f"{type(exc).__name__}: {exc}")
            hooktrace.root.indent -= 1

        writers = self._trace_writers
        writers.append(write)
        if len(writers) == 1:  # one writer and one monitor, however many callers trace
            self.trace.root.setwriter(lambda line: [w(line) for w in list(writers)])
            self._undo_monitoring = self.add_hookcall_monitoring(before, after)

        def undo() -> None:
            if write not in writers:
                return
            writers.remove(write)
            if not writers:
                self._undo_monitoring()
                self.trace.root.setwriter(None)

        return undo

    def _debug_from_env(self) -> None:
        """Start or stop ``FXSYM_DEBUG``'s tracing to follow the environment variable."""
        wanted = _env_flag("FXSYM_DEBUG")
        if wanted and self._debug_undo is None:
            self._debug_undo = self.trace_hooks(lambda line: sys.stderr.write(line))
        elif not wanted and self._debug_undo is not None:
            self._debug_undo()
            self._debug_undo = None

    def answered_hooks(self, plugin_name: str) -> list[str]:
        """The hooks plugin ``plugin_name`` implements, sorted, a wrapper marked
        ``(wrapper)``; plain ``fxsym_register_*`` implementations are left out (what they
        register is listed by the registry)."""
        plugin = self.get_plugin(plugin_name)
        names: list[str] = []
        for caller in (self.get_hookcallers(plugin) or []) if plugin is not None else []:
            for impl in caller.get_hookimpls():
                wrapper = impl.wrapper or impl.hookwrapper
                if impl.plugin is not plugin or (
                        caller.name.startswith("fxsym_register_") and not wrapper):
                    continue
                names.append(caller.name + (" (wrapper)" if wrapper else ""))
        return sorted(names)

    def source(self, plugin_name: str) -> PluginSource:
        """The distribution behind a plugin (``<local>`` for one registered in code)."""
        return self.sources.get(plugin_name, PluginSource(plugin_name, "<local>", ""))

    def report_failure(
        self,
        name: str,
        distribution: str,
        error: BaseException,
        during: str = "import",
        *,
        raise_strict: bool = True,
    ) -> None:
        """Record that plugin ``name`` failed and warn, or raise :class:`PluginError` in strict
        mode (unless ``raise_strict=False``: another exception is already on its way)."""
        failure = PluginFailure(name, distribution, f"{type(error).__name__}: {error}", during)
        self.failed = [f for f in self.failed if f.name != name] + [failure]
        where = "" if during == "import" else f" in {during}"
        message = (
            f"fxsym plugin {name!r} (distribution {distribution!r}) failed{where} and was "
            f"disabled: {failure.error}"
        )
        if raise_strict and strict():
            raise PluginError(message) from error
        warnings.warn(message, PluginWarning, stacklevel=3)

    def disable(
        self, name: str, error: BaseException, during: str, *, raise_strict: bool = True
    ) -> None:
        """Turn off plugin ``name`` for the rest of the process because ``during`` raised
        ``error``: block it (which unregisters it), record and report the failure (once: a
        plugin already disabled is left alone)."""
        if not self.has_plugin(name):
            return
        distribution = self.source(name).distribution
        self._from_entry_points.discard(name)
        self.sources.pop(name, None)
        self.report_failure(name, distribution, error, during, raise_strict=raise_strict)

    def load(
        self, allow: Iterable[str] | None, block: Iterable[str] | None, rescan: bool
    ) -> None:
        if rescan:
            _entry_points.cache_clear()
            rescan_declarations()  # the torch-free declarations' entry points too
            self.failed = []  # unblocks their names
        allowed = set(allow) if allow is not None else None
        env = os.environ.get("FXSYM_PLUGINS", "").strip()
        autoload = not _env_flag("FXSYM_DISABLE_PLUGIN_AUTOLOAD")
        if env:
            names = {n.strip() for n in env.split(",") if n.strip()}
            allowed = names if allowed is None else allowed & names
            if autoload:
                self._warn_unknown(names)
        if block is None and allow is None and not rescan:
            blocked = set(self._blocked_on_request)  # a plain load keeps the last choice
        else:
            blocked = set(block or ())
        failed = {f.name for f in self.failed}
        for name in sorted(self._blocked_on_request - blocked - failed):
            self.unblock(name)
        for name in sorted(blocked - self._blocked_on_request):
            self.set_blocked(name)
            self._from_entry_points.discard(name)
            self.sources.pop(name, None)
        self._blocked_on_request = blocked
        wanted: dict[str, metadata.EntryPoint] = {}
        if autoload:
            for ep in _entry_points():
                if (allowed is None or ep.name in allowed) and ep.name not in blocked:
                    wanted.setdefault(ep.name, ep)
        for name in sorted(self._from_entry_points - wanted.keys()):
            self.unregister(name=name)
            self._from_entry_points.discard(name)
            self.sources.pop(name, None)
        for name, ep in wanted.items():
            if name in self._from_entry_points or any(f.name == name for f in self.failed):
                continue
            dist, version = _dist_of(ep)
            try:
                plugin = ep.load()
                if isinstance(plugin, type):  # one instance, holding its state, per manager
                    plugin = plugin()
                self.register(plugin, name=name)
            except PLUGIN_ERRORS as exc:  # a broken plugin never takes the host down
                self.report_failure(name, dist, exc)
                continue
            self._from_entry_points.add(name)
            self.sources[name] = PluginSource(name, dist, version)

    def _warn_unknown(self, names: set[str]) -> None:
        """Warn (once per distinct question) about ``FXSYM_PLUGINS`` names that match no
        installed entry point."""
        known = sorted({ep.name for ep in _entry_points()})
        unknown = sorted(names - set(known))
        if not unknown or (unknown, known) == self._unknown_warned:
            return
        self._unknown_warned = (unknown, known)
        warnings.warn(
            f"FXSYM_PLUGINS names {', '.join(map(repr, unknown))}, which match no installed "
            f"fxsym plugin; known: {', '.join(map(repr, known)) or 'none'}",
            PluginWarning,
            stacklevel=4,
        )


_DEFAULT: PluginManager | None = None
_CURRENT: ContextVar[PluginManager | None] = ContextVar("fxsym_plugin_manager", default=None)


def default_plugin_manager() -> PluginManager:
    """The process-wide manager: the one :func:`load_plugins` fills from the entry points
    unless told otherwise, and the one used outside :func:`use_plugins`."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = PluginManager()
    return _DEFAULT


def get_plugin_manager() -> PluginManager:
    """The manager in use: the innermost :func:`use_plugins` of this thread (or task), else
    :func:`default_plugin_manager`."""
    return _CURRENT.get() or default_plugin_manager()


@contextmanager
def use_plugins(pm: PluginManager) -> Iterator[PluginManager]:
    """Make ``pm`` the manager of every fxsym call in this block (this thread or task only).

    Each manager has its own plugins, registry and plugin state, so two managers with
    different plugin sets give independent answers in one process. A manager made by the
    caller holds exactly what is registered or loaded into it
    (``load_plugins(manager=pm, ...)``): tracing autoloads entry points only into the default
    manager. Registrations made with ``SymMap.register`` apply under every manager.
    """
    token = _CURRENT.set(pm)
    try:
        yield pm
    finally:
        _CURRENT.reset(token)


def active_plugins() -> PluginManager:
    """The manager a trace uses: the current one, with the entry points loaded first when it
    is the default manager."""
    pm = get_plugin_manager()
    if pm is default_plugin_manager():
        load_plugins()
    else:
        pm._debug_from_env()
    return pm


def load_plugins(
    *,
    allow: Iterable[str] | None = None,
    block: Iterable[str] | None = None,
    rescan: bool = False,
    manager: PluginManager | None = None,
) -> PluginManager:
    """Load the plugins of the ``fxsym`` entry-point group; cheap and idempotent.

    ``allow`` keeps only the named entry points, ``block`` drops the named ones (a plugin
    loaded earlier and now excluded is unregistered; a blocked name is marked with pluggy's
    ``set_blocked`` and stays blocked for later calls until one passes ``allow``/``block``
    again or ``rescan=True``). ``rescan=True`` reads the installed entry points again, e.g.
    after a ``pip install`` in the same process. ``manager`` is the manager to load into
    (default: :func:`get_plugin_manager`).
    """
    pm = manager or get_plugin_manager()
    pm._debug_from_env()
    pm.load(allow, block, rescan)
    return pm
