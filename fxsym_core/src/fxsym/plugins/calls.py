"""Calling plugin hooks in isolation: one failing plugin never breaks an analysis.

Every hook is called plugin by plugin (never through pluggy's ``pm.hook.<name>(...)``, which
stops at the first exception): an implementation that raises one of
:data:`~fxsym.plugins.manager.PLUGIN_ERRORS` gets its plugin disabled
(:meth:`~fxsym.plugins.manager.PluginManager.disable`: unregistered, recorded, reported once)
and the call goes on with the others. In strict mode (``FXSYM_STRICT_PLUGINS=1``) the
:class:`~fxsym.errors.PluginError` raised by ``disable`` propagates to the caller of
``fxsym.trace``/``fxsym.analyze`` as it is.

Implementations are called in pluggy's order (``tryfirst`` first, then the most recently
registered first) with the arguments each one declares. Hook wrappers are not supported for
these hooks and are skipped.

Each implementation is still called through pluggy (:func:`call_one`: a
``pm.subset_hook_caller`` holding that one plugin), so pluggy's hook-call monitoring sees every
call and names the plugin that answered: ``FXSYM_DEBUG=1`` (see
:meth:`~fxsym.plugins.manager.PluginManager.trace_hooks`) and any monitor added with
``pm.add_hookcall_monitoring`` see fxsym's isolated calls like ordinary ones.

* :func:`trace_contexts` — every plugin's ``fxsym_trace_context``, entered one by one;
* :func:`first_result` — a ``firstresult`` hook, e.g. :func:`example_inputs`
  (``fxsym_example_inputs``);
* :func:`leaf_vote` — the leaf policies plugins registered (see :mod:`fxsym.registry`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import ExitStack
from types import TracebackType
from typing import Any

from pluggy import HookImpl

from .manager import PLUGIN_ERRORS, PluginManager, get_plugin_manager


def implementations(pm: PluginManager, hook_name: str) -> list[HookImpl]:
    """The plain implementations of ``hook_name`` in the order pluggy would call them."""
    impls = getattr(pm.hook, hook_name).get_hookimpls()
    return [i for i in reversed(impls) if not (i.hookwrapper or i.wrapper)]


def call_impl(impl: HookImpl, **kwargs: Any) -> Any:
    """Call one implementation with the subset of ``kwargs`` it declares (as pluggy does)."""
    return impl.function(*(kwargs[name] for name in impl.argnames))


def call_one(pm: PluginManager, hook_name: str, impl: HookImpl, **kwargs: Any) -> Any:
    """Call the one implementation ``impl`` of ``hook_name`` through pluggy, and return its
    result (``None`` when it returned ``None``).

    The call goes through ``pm.subset_hook_caller`` with every other plugin removed, so
    pluggy's monitoring (``add_hookcall_monitoring``, ``enable_tracing``) sees it. Should the
    subset hold anything else (an implementation registered under another ``specname``), the
    implementation is called directly instead.
    """
    others = [p for p in pm.get_plugins() if p is not impl.plugin]
    caller = pm.subset_hook_caller(hook_name, remove_plugins=others)
    if caller.get_hookimpls() != [impl]:
        return call_impl(impl, **kwargs)
    result = caller(**kwargs)
    if caller.spec is not None and caller.spec.opts.get("firstresult"):
        return result
    return result[0] if result else None


def trace_contexts(model: Any, example_inputs: Any, pm: PluginManager | None = None) -> Any:
    """A context manager entering every plugin's ``fxsym_trace_context`` for one trace.

    * a plugin whose hook or whose context's ``__enter__`` raises is disabled and the trace
      goes on without it. Its context is not exited: the protocol has no exit for a context
      that was never entered, so undoing what a failed ``__enter__`` did is that context's
      own job (``contextlib.contextmanager`` runs the generator's ``finally``);
    * a context whose ``__exit__`` raises is disabled; the contexts entered before it are
      still exited. When the trace itself raised, its exception is the one that propagates
      (the plugin's failure is then only warned, even in strict mode);
    * a context cannot swallow the trace's exception: its ``__exit__`` result is ignored;
    * in strict mode the ``PluginError`` of a failing ``__enter__`` propagates once the
      contexts already entered are exited.
    """
    return _TraceContexts(pm or get_plugin_manager(), model, example_inputs)


class _TraceContexts:
    def __init__(self, pm: PluginManager, model: Any, example_inputs: Any) -> None:
        self._pm = pm
        self._kwargs = {"model": model, "example_inputs": example_inputs}
        self._stack = ExitStack()

    def __enter__(self) -> _TraceContexts:
        with ExitStack() as stack:  # exits what was entered if a strict failure propagates
            for impl in implementations(self._pm, "fxsym_trace_context"):
                name = impl.plugin_name
                try:
                    ctx = call_one(self._pm, "fxsym_trace_context", impl, **self._kwargs)
                    if ctx is None:
                        continue
                    exit_fn = type(ctx).__exit__
                    type(ctx).__enter__(ctx)
                except PLUGIN_ERRORS as exc:
                    self._pm.disable(name, exc, "fxsym_trace_context")
                    continue
                stack.push(_guarded_exit(self._pm, name, ctx, exit_fn))
            self._stack = stack.pop_all()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return self._stack.__exit__(exc_type, exc, tb)


def _guarded_exit(
    pm: PluginManager, name: str, ctx: Any, exit_fn: Callable[..., Any]
) -> Callable[..., bool]:
    def exit_(
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        try:
            exit_fn(ctx, exc_type, exc, tb)
        except PLUGIN_ERRORS as err:
            if err is not exc:  # re-raising the exception it was given is not a failure
                pm.disable(name, err, "fxsym_trace_context (exit)", raise_strict=exc is None)
        return False

    return exit_


def first_result(hook_name: str, pm: PluginManager | None = None, **kwargs: Any) -> Any:
    """The first non-``None`` result of a ``firstresult`` hook, or ``None``; a plugin whose
    implementation raises is disabled and the next one asked."""
    pm = pm or get_plugin_manager()
    for impl in implementations(pm, hook_name):
        try:
            result = call_one(pm, hook_name, impl, **kwargs)
        except PLUGIN_ERRORS as exc:
            pm.disable(impl.plugin_name, exc, hook_name)
            continue
        if result is not None:
            return result
    return None


def example_inputs(model: Any, pm: PluginManager | None = None) -> Any:
    """The plugins' default example inputs for ``model`` (``fxsym_example_inputs``), or
    ``None``."""
    return first_result("fxsym_example_inputs", pm, model=model)


def leaf_vote(
    policies: Iterable[tuple[Callable[..., Any], str]],
    module: Any,
    qualname: str,
    pm: PluginManager | None = None,
) -> bool | None:
    """The first ``True``/``False`` of ``policies``, each given as ``(policy, plugin_name)``,
    or ``None`` if none votes.

    A policy that raises gets its plugin disabled and the vote goes on without that plugin's
    policies (the registry's later lists no longer hold them: disabling bumps the plugin
    generation, so the registry collects again)."""
    pm = pm or get_plugin_manager()
    disabled: set[str] = set()
    for policy, source in policies:
        if source in disabled:
            continue
        try:
            vote = policy(module, qualname)
        except PLUGIN_ERRORS as exc:
            pm.disable(source, exc, "leaf policy")
            disabled.add(source)
            continue
        if vote is not None:
            return bool(vote)
    return None
